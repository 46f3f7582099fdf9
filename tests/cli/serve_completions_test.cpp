// POST /v1/completions through deltaserve serve, as vLLM's and llama-server's clients call
// it: a raw prompt (text, or the ids /tokenize gives for it: the same answer), greedy text
// equal to the model's own continuation, whole and streamed, echo, stop and logprobs as a
// count; fields it does not serve are a 400 naming them. (The prompt's logprobs:
// serve_prompt_logprobs_test.)
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "default_model.h"
#include "deltaserve/model/model.h"
#include "http_client.h"
#include "serving.h"
#include "test_paths.h"

namespace deltaserve::testing {
namespace {

constexpr const char* kPrompt = "The capital of France is";

class ServeCompletionsTest : public ::testing::Test {
  protected:
    void SetUp() override { DS_REQUIRE_FILE(default_gguf_model(), "default GGUF model"); }
};

HttpResponse complete(uint16_t port, const json& body) {
    return http_request(port, "POST", "/v1/completions", body.dump());
}

json prompt_body(const json& prompt, int max_tokens) {
    return {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}};
}

TEST_F(ServeCompletionsTest, ARawPromptContinuesAsTheModelDoes) {
    ServingProcess server(serve_args({}));
    ASSERT_NE(server.port(), 0) << server.log();
    const uint16_t port = server.port();
    HttpResponse r = complete(port, prompt_body(kPrompt, 10));
    ASSERT_EQ(r.status, 200) << r.body;
    const json whole = json::parse(r.body);
    EXPECT_EQ(whole["object"], "text_completion");
    const std::string text = whole["choices"][0]["text"];
    EXPECT_EQ(whole["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(whole["usage"]["completion_tokens"], 10);

    // The same prompt as ids: the same answer.
    r = http_request(port, "POST", "/tokenize", json{{"prompt", kPrompt}}.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    const std::vector<int32_t> ids = json::parse(r.body)["tokens"];
    EXPECT_EQ(whole["usage"]["prompt_tokens"].get<size_t>(), ids.size());
    r = complete(port, prompt_body(ids, 10));
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], text);
    r = complete(port, prompt_body(json::array({kPrompt}), 10));  // one prompt in a list
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], text);

    // Streamed: the same text; echo: the prompt first.
    json body = prompt_body(kPrompt, 10);
    body["stream"] = true;
    r = complete(port, body);
    ASSERT_EQ(r.status, 200) << r.body;
    std::string streamed;
    for (size_t at = 0; (at = r.body.find("data: {", at)) != std::string::npos;) {
        const size_t end = r.body.find("\n\n", at);
        const json chunk = json::parse(r.body.substr(at + 6, end - at - 6));
        at = end;
        EXPECT_EQ(chunk["object"], "text_completion");
        for (const json& c : chunk["choices"]) streamed += c["text"].get<std::string>();
    }
    EXPECT_EQ(streamed, text);
    body = prompt_body(kPrompt, 10);
    body["echo"] = true;
    r = complete(port, body);
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], std::string(kPrompt) + text);
    body["prompt"] = ids;  // a prompt of ids echoes as their text
    r = complete(port, body);
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], std::string(kPrompt) + text);

    // Logprobs as a count: the tokens spell the text, each with its top alternatives.
    body = prompt_body(kPrompt, 10);
    body["logprobs"] = 3;
    r = complete(port, body);
    ASSERT_EQ(r.status, 200) << r.body;
    const json lp = json::parse(r.body)["choices"][0]["logprobs"];
    ASSERT_EQ(lp["tokens"].size(), 10u) << r.body;
    std::string joined;
    size_t offset = 0;
    for (size_t i = 0; i < lp["tokens"].size(); ++i) {
        EXPECT_EQ(lp["text_offset"][i].get<size_t>(), offset);
        const std::string t = lp["tokens"][i];
        joined += t;
        offset += t.size();  // ASCII here: characters are bytes
        EXPECT_EQ(lp["top_logprobs"][i].size(), 3u);
        EXPECT_NEAR(lp["top_logprobs"][i][t].get<double>(), lp["token_logprobs"][i].get<double>(),
                    1e-6)
            << "greedy takes the most likely token";
    }
    EXPECT_EQ(joined, text);

    // A stop string ends it, as in chat.
    body = prompt_body(kPrompt, 10);
    const std::string cut = text.substr(0, text.size() / 2);
    body["stop"] = text.substr(text.size() / 2, 2);
    r = complete(port, body);
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["choices"][0]["finish_reason"], "stop");
    EXPECT_EQ(json::parse(r.body)["choices"][0]["text"].get<std::string>().substr(0, 1),
              cut.substr(0, 1));

    // The model's own greedy continuation of those ids.
    EXPECT_EQ(server.stop(), 0) << server.log();
    std::unique_ptr<model::Model> m(load_default_model());
    ASSERT_NE(m, nullptr);
    std::string own;
    int32_t prev = ids.back();
    for (const GreedyStep& step : greedy_steps(*m, ids, 10)) {
        own += m->tokenizer->token_to_piece(step.token, prev);
        prev = step.token;
    }
    EXPECT_EQ(text, own);
}

TEST_F(ServeCompletionsTest, FieldsNotServedAreRefusedByName) {
    ServingProcess server(serve_args({}));
    ASSERT_NE(server.port(), 0) << server.log();
    const std::pair<json, const char*> cases[] = {
        {json::object(), "'prompt' is required"},
        {{{"prompt", ""}}, "'prompt' is empty"},
        {{{"prompt", json::array({"a", "b"})}}, "'prompt' holds 2 prompts"},
        {{{"prompt", json::array({1, "x"})}}, "'prompt'"},
        {{{"prompt", json::array({99999999})}}, "outside the vocabulary"},
        {{{"prompt", "x"}, {"suffix", "y"}}, "'suffix'"},
        {{{"prompt", "x"}, {"best_of", 2}}, "'best_of'"},
        {{{"prompt", "x"}, {"n", 17}}, "'n'"},
        {{{"prompt", "x"}, {"n", 2}, {"stream", true}}, "'n'"},
        {{{"prompt", "x"}, {"logprobs", 21}}, "'logprobs'"},
        {{{"prompt", "x"}, {"logit_bias", {{"5", 1}}}}, "'logit_bias'"},
        {{{"prompt", "x"}, {"temperature", 9}}, "temperature"},
    };
    for (const auto& [body, named] : cases) {
        const HttpResponse r = complete(server.port(), body);
        EXPECT_EQ(r.status, 400) << body.dump();
        EXPECT_NE(r.body.find(named), std::string::npos) << body.dump() << ": " << r.body;
    }
    EXPECT_EQ(http_request(server.port(), "GET", "/v1/completions").status, 405);
    EXPECT_EQ(server.stop(), 0) << server.log();
}

}  // namespace
}  // namespace deltaserve::testing
