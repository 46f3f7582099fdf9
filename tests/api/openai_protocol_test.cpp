// The OpenAI request parser and answer JSON: what clients send is read as they mean it,
// what they must not send is refused naming the field, and pieces never split a character.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>

#include "deltaserve/api/openai_protocol.h"

namespace deltaserve::api {
namespace {

using json = nlohmann::json;

model::SamplingParams server_defaults() {
    model::SamplingParams s;
    s.temperature = 0.7f;
    s.top_k = 40;
    return s;
}

TEST(OpenAiProtocol, ReadsTheUsualFields) {
    const json body = {
        {"model", "m"},
        {"messages",
         json::array({{{"role", "developer"}, {"content", "Be brief."}},
                      {{"role", "user"},
                       {"content", json::array({{{"type", "text"}, {"text", "Hi "}},
                                                {{"type", "text"}, {"text", "there"}}})}}})},
        {"max_completion_tokens", 9},
        {"top_p", 0.5},
        {"seed", 42},
        {"stop", "END"},
        {"stream", true},
        {"stream_options", {{"include_usage", true}}},
        {"session_id", "s1"},
        {"logit_bias", json::object()},  // neutral values of fields not served: accepted
        {"presence_penalty", 0.5},
        {"logprobs", false},
        {"modalities", {"text"}},
        {"user", "u-1"}};  // changes nothing: ignored
    auto r = parse_chat_request(body.dump(), server_defaults());
    ASSERT_TRUE(r.ok()) << r.error().message();
    EXPECT_EQ(r->model, "m");
    ASSERT_EQ(r->messages.size(), 2u);
    EXPECT_EQ(r->messages[0].role, "system");
    EXPECT_EQ(r->messages[1].content, "Hi there");
    EXPECT_EQ(r->max_tokens, 9);
    EXPECT_FLOAT_EQ(r->sampling.top_p, 0.5f);
    EXPECT_FLOAT_EQ(r->sampling.temperature, 0.7f) << "not given: the server's default";
    EXPECT_EQ(r->sampling.top_k, 40);
    EXPECT_TRUE(r->seed_given);
    EXPECT_EQ(r->sampling.seed, 42u);
    EXPECT_EQ(r->stop, std::vector<std::string>{"END"});
    EXPECT_TRUE(r->stream);
    EXPECT_TRUE(r->include_usage);
    EXPECT_EQ(r->session_id, "s1");
    EXPECT_FLOAT_EQ(r->sampling.presence_penalty, 0.5f);
}

TEST(OpenAiProtocol, FieldsNotServedAreRefusedByName) {
    const std::pair<const char*, json> cases[] = {
        {"logprobs", "yes"},
        {"top_logprobs", 5},  // without logprobs true
        {"logit_bias", {{"42", -100}}},
        {"presence_penalty", 2.5},  // out of OpenAI's range
        {"frequency_penalty", -3},
        {"functions", json::array({{{"name", "f"}}})},
        {"function_call", "auto"},
        {"audio", {{"voice", "alloy"}}},
        {"modalities", {"text", "audio"}},
        {"prediction", {{"type", "content"}, {"content", "x"}}},
        {"reasoning_effort", "high"},
    };
    for (const auto& [field, value] : cases) {
        json body = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};
        body[field] = value;
        auto r = parse_chat_request(body.dump(), server_defaults());
        ASSERT_FALSE(r.ok()) << field;
        EXPECT_NE(r.error().message().find(std::string("'") + field + "'"), std::string::npos)
            << r.error().message();
    }
}

TEST(OpenAiProtocol, LogprobsAsOpenAiTakesThem) {
    json body = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};
    auto r = parse_chat_request(body.dump(), server_defaults());
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->top_logprobs, -1);
    body["logprobs"] = true;
    r = parse_chat_request(body.dump(), server_defaults());
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->top_logprobs, 0);
    body["top_logprobs"] = 20;
    r = parse_chat_request(body.dump(), server_defaults());
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->top_logprobs, 20);
    body["top_logprobs"] = 21;
    EXPECT_FALSE(parse_chat_request(body.dump(), server_defaults()).ok());
    body["logprobs"] = false;
    body["top_logprobs"] = 0;
    r = parse_chat_request(body.dump(), server_defaults());
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->top_logprobs, -1);
}

TEST(OpenAiProtocol, RefusesWhatItCannotDoNamingTheField) {
    const auto error_of = [](const std::string& body) {
        auto r = parse_chat_request(body, server_defaults());
        return r.ok() ? std::string("accepted") : r.error().message();
    };
    const std::string user = R"("messages": [{"role": "user", "content": "hi"}])";
    EXPECT_NE(error_of("{").find("not valid JSON"), std::string::npos);
    EXPECT_NE(error_of("[]").find("JSON object"), std::string::npos);
    EXPECT_NE(error_of(R"({"messages": []})").find("'messages'"), std::string::npos);
    EXPECT_NE(error_of(R"({"messages": [{"content": "x"}]})").find("'messages[0].role'"),
              std::string::npos);
    EXPECT_NE(error_of(R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})")
                  .find("not text"),
              std::string::npos);
    EXPECT_NE(error_of("{" + user + R"(, "temperature": -1})").find("'temperature'"),
              std::string::npos);
    EXPECT_NE(error_of("{" + user + R"(, "top_p": 0})").find("'top_p'"), std::string::npos);
    EXPECT_NE(error_of("{" + user + R"(, "max_tokens": 0})").find("'max_tokens'"),
              std::string::npos);
    EXPECT_NE(error_of("{" + user + R"(, "max_tokens": 1.5})").find("'max_tokens'"),
              std::string::npos);
    EXPECT_NE(error_of("{" + user + R"(, "n": 17})").find("'n'"), std::string::npos);
    EXPECT_NE(error_of("{" + user + R"(, "n": 0})").find("'n'"), std::string::npos);
    EXPECT_NE(error_of("{" + user + R"(, "n": 2, "stream": true})").find("'n'"), std::string::npos);
    EXPECT_EQ(error_of("{" + user + R"(, "n": 3})"), "accepted");
    EXPECT_NE(error_of("{" + user + R"(, "stop": ["a", "b", "c", "d", "e"]})").find("'stop'"),
              std::string::npos);
    EXPECT_NE(error_of("{" + user + R"(, "stop": [""]})").find("'stop'"), std::string::npos);
    EXPECT_NE(error_of("{" + user + R"(, "stream": "yes"})").find("'stream'"), std::string::npos);
    EXPECT_NE(error_of(R"({"messages": [{"role": "user", "content": "\xff"}]})").find("JSON"),
              std::string::npos);
    EXPECT_EQ(error_of("{" + user + "}"), "accepted");
}

// Every field the parser reads, given every JSON type: an answer (accepted or a 400 naming
// the field), never an exception. A field of the wrong type once aborted the process.
TEST(OpenAiProtocol, EveryFieldOfEveryJsonTypeGetsAnAnswer) {
    const std::vector<json> values = {nullptr,
                                      true,
                                      -1,
                                      0,
                                      3,
                                      1.5,
                                      1e300,
                                      "x",
                                      "",
                                      json::array(),
                                      json::object(),
                                      json::array({nullptr, 2}),
                                      {{"a", 1}},
                                      json::array({json::object()})};
    const json base = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};
    // Paths into the request: top-level fields, a message's fields, a content part's fields.
    const std::vector<std::vector<std::string>> paths = {{"model"},
                                                         {"messages"},
                                                         {"temperature"},
                                                         {"top_p"},
                                                         {"min_p"},
                                                         {"top_k"},
                                                         {"repetition_penalty"},
                                                         {"seed"},
                                                         {"max_tokens"},
                                                         {"max_completion_tokens"},
                                                         {"n"},
                                                         {"stop"},
                                                         {"stream"},
                                                         {"stream_options"},
                                                         {"stream_options", "include_usage"},
                                                         {"session_id"},
                                                         {"messages", "0"},
                                                         {"messages", "0", "role"},
                                                         {"messages", "0", "content"},
                                                         {"messages", "0", "content", "0"},
                                                         {"messages", "0", "content", "0", "type"},
                                                         {"messages", "0", "content", "0", "text"}};
    int refused = 0;
    for (const auto& path : paths) {
        for (const json& v : values) {
            json body = base;
            if (path.size() >= 4) {
                body["messages"][0]["content"] = json::array({{{"type", "text"}, {"text", "a"}}});
            }
            if (path.size() == 2 && path[0] == "stream_options") body["stream_options"] = {};
            json* at = &body;
            for (size_t i = 0; i + 1 < path.size(); ++i) {
                at = at->is_array() ? &(*at)[std::stoul(path[i])] : &(*at)[path[i]];
            }
            if (at->is_array()) {
                (*at)[std::stoul(path.back())] = v;
            } else {
                (*at)[path.back()] = v;
            }
            Result<ChatRequest> r = unavailable("not run");
            ASSERT_NO_THROW(r = parse_chat_request(body.dump(), server_defaults())) << body.dump();
            if (!r.ok()) {
                ++refused;
                EXPECT_EQ(r.error().code(), StatusCode::kInvalidArgument) << body.dump();
                // The message names the field, or its first part.
                EXPECT_NE(r.error().message().find(path[0]), std::string::npos)
                    << body.dump() << " -> " << r.error().message();
            }
        }
    }
    EXPECT_GT(refused, 150);  // most of these are wrong
}

TEST(OpenAiProtocol, BoundsNestingAndSizeBeforeParsing) {
    const std::string user = R"("messages": [{"role": "user", "content": "hi"}])";
    auto deep =
        "{" + user + R"(, "x": )" + std::string(200000, '[') + std::string(200000, ']') + "}";
    auto r = parse_chat_request(deep, server_defaults());
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message().find("nests deeper"), std::string::npos);
    std::string wide = "{" + user + R"(, "x": [0)";
    for (int i = 0; i < 70000; ++i) wide += ",0";
    wide += "]}";
    r = parse_chat_request(wide, server_defaults());
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message().find("JSON values"), std::string::npos);
    // Brackets inside strings are text, not nesting.
    r = parse_chat_request(
        R"({"messages": [{"role": "user", "content": ")" + std::string(1000, '[') + R"("}]})",
        server_defaults());
    EXPECT_TRUE(r.ok()) << r.error().message();
    json many = {{"messages", json::array()}};
    for (size_t i = 0; i <= kMaxMessages; ++i) many["messages"].push_back({{"role", "user"}});
    r = parse_chat_request(many.dump(), server_defaults());
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message().find("'messages'"), std::string::npos);
}

TEST(OpenAiProtocol, SessionIdsHaveOneAlphabet) {
    for (const char* ok : {"a", "chat-42", "user_7:thread.3", "ABCxyz-09"}) {
        EXPECT_TRUE(check_session_id(ok, "session_id").ok()) << ok;
    }
    for (const std::string& no : {std::string(), std::string("a\r\nSet-Cookie: x=1"),
                                  std::string("a b"), std::string("a/b"), std::string("\xc3\xa9"),
                                  std::string(129, 'a'), std::string("a\0b", 3)}) {
        const Status st = check_session_id(no, "session_id");
        EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << no;
        EXPECT_NE(st.message().find("'session_id'"), std::string::npos);
    }
    EXPECT_TRUE(check_session_id(std::string(128, 'a'), "session_id").ok());
    const json body = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})},
                       {"session_id", "x\r\nX-Injected: 1"}};
    auto r = parse_chat_request(body.dump(), server_defaults());
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message().find("'session_id'"), std::string::npos);
}

TEST(OpenAiProtocol, SamplingValuesThatMakeNoSenseAreRefused) {
    const std::string user = R"({"messages": [{"role": "user", "content": "hi"}], )";
    for (const char* field : {R"("repetition_penalty": 0)", R"("repetition_penalty": -1)",
                              R"("temperature": 2.5)", R"("top_p": 1.5)", R"("min_p": -0.1)",
                              R"("top_k": 2000000)", R"("temperature": 1e300)"}) {
        auto r = parse_chat_request(user + field + "}", server_defaults());
        EXPECT_FALSE(r.ok()) << field;
    }
    // Defaults a server was started with are checked by the same validator.
    model::SamplingParams nan_defaults = server_defaults();
    nan_defaults.temperature = std::nanf("");
    EXPECT_FALSE(model::validate_sampling(nan_defaults).ok());
    auto r = parse_chat_request(user + R"("top_k": -1})", server_defaults());
    ASSERT_TRUE(r.ok()) << r.error().message();
    EXPECT_EQ(r->sampling.top_k, 0) << "-1 means off, as vLLM";
}

TEST(OpenAiProtocol, AnswersAndChunksHaveTheShapesClientsRead) {
    Usage u{12, 3, 10};
    const json a = json::parse(completion_json("id1", 7, "m", "Paris.", "stop", u, "s"));
    EXPECT_EQ(a["object"], "chat.completion");
    EXPECT_EQ(a["choices"][0]["message"]["content"], "Paris.");
    EXPECT_EQ(a["choices"][0]["finish_reason"], "stop");
    EXPECT_EQ(a["usage"]["total_tokens"], 15);
    EXPECT_EQ(a["usage"]["prompt_tokens_details"]["cached_tokens"], 10);
    EXPECT_EQ(a["session_id"], "s");
    const json first =
        json::parse(chunk_json("id1", 7, "m", std::string("Pa"), true, "", std::nullopt));
    EXPECT_EQ(first["object"], "chat.completion.chunk");
    EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
    EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
    const json last =
        json::parse(chunk_json("id1", 7, "m", std::nullopt, false, "length", std::nullopt));
    EXPECT_FALSE(last["choices"][0]["delta"].contains("content"));
    EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
    const json usage = json::parse(chunk_json("id1", 7, "m", std::nullopt, false, "", u));
    EXPECT_TRUE(usage["choices"].empty());
    EXPECT_EQ(usage["usage"]["completion_tokens"], 3);
    const json e = json::parse(error_json("bad 'x'", "invalid_request_error", 400));
    EXPECT_EQ(e["error"]["message"], "bad 'x'");
    EXPECT_EQ(e["error"]["code"], 400);
}

}  // namespace
}  // namespace deltaserve::api
