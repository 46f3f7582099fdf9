// The OpenAI request parser and answer JSON: what clients send is read as they mean it,
// what they must not send is refused naming the field, and pieces never split a character.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

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
        {"logit_bias", json::object()}};  // unknown to us: ignored
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
    EXPECT_NE(error_of("{" + user + R"(, "n": 3})").find("'n'"), std::string::npos);
    EXPECT_NE(error_of("{" + user + R"(, "stop": ["a", "b", "c", "d", "e"]})").find("'stop'"),
              std::string::npos);
    EXPECT_NE(error_of("{" + user + R"(, "stop": [""]})").find("'stop'"), std::string::npos);
    EXPECT_NE(error_of("{" + user + R"(, "stream": "yes"})").find("'stream'"), std::string::npos);
    EXPECT_NE(error_of(R"({"messages": [{"role": "user", "content": "\xff"}]})").find("JSON"),
              std::string::npos);
    EXPECT_EQ(error_of("{" + user + "}"), "accepted");
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
