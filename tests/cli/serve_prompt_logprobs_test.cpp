// A prompt's log-probabilities through deltaserve serve, as lm-evaluation-harness's
// loglikelihood tasks ask for them: completions' echo with logprobs (the prompt's tokens
// first, the first null, then the answer's) and vLLM's prompt_logprobs. Each prompt token's
// value is the model's own (the log-softmax of the logits before it, computed here), the
// same where the prompt was cached before, and an answer's tokens score the same as a
// prompt as they did when generated. That last holds with llama.cpp's rounding (--attention
// ggml), as in llama-server; deltaserve's own arithmetic rounds a prompt chunk and a decode
// step differently (by up to ~0.06 nats on this model). The vLLM, chat and streaming cases
// as vLLM answers them.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "default_model.h"
#include "deltaserve/model/inference_context.h"
#include "deltaserve/model/model.h"
#include "deltaserve/model/scoring.h"
#include "http_client.h"
#include "serving.h"
#include "test_paths.h"

namespace deltaserve::testing {
namespace {

constexpr const char* kPrompt = "The capital of France is";
constexpr int kTop = 3;

class ServePromptLogprobsTest : public ::testing::Test {
  protected:
    void SetUp() override { DS_REQUIRE_FILE(default_gguf_model(), "default GGUF model"); }
};

HttpResponse complete(uint16_t port, const json& body) {
    return http_request(port, "POST", "/v1/completions", body.dump());
}

json scored_body(const json& prompt, int max_tokens) {
    return {{"prompt", prompt},
            {"max_tokens", max_tokens},
            {"temperature", 0},
            {"echo", true},
            {"logprobs", kTop}};
}

std::vector<int32_t> tokenize(uint16_t port, const std::string& text) {
    const HttpResponse r = http_request(port, "POST", "/tokenize", json{{"prompt", text}}.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body)["tokens"];
}

// log P(tokens[i] | tokens[0..i)) for i >= 1, from this process's own evaluation.
// With llama.cpp's rounding and one thread, as the server below.
std::vector<double> own_scores(const model::Model& m, const std::vector<int32_t>& tokens) {
    model::ContextOptions co;
    co.n_ctx = static_cast<int32_t>(tokens.size()) + 1;
    co.n_threads = 1;
    co.attention = model::AttentionNumerics::kGgml;
    auto ctx = model::InferenceContext::create(m, co);
    EXPECT_TRUE(ctx.ok()) << ctx.error().to_string();
    if (!ctx.ok()) return {};
    auto rows = (*ctx)->eval_all(tokens);
    EXPECT_TRUE(rows.ok()) << rows.error().to_string();
    if (!rows.ok()) return {};
    const int32_t nv = m.config.n_vocab;
    std::vector<double> out, lp;
    for (size_t i = 1; i < tokens.size(); ++i) {
        model::log_softmax(rows->data() + (i - 1) * static_cast<size_t>(nv), nv, lp);
        out.push_back(lp[static_cast<size_t>(tokens[i])]);
    }
    return out;
}

TEST_F(ServePromptLogprobsTest, EchoScoresThePromptAsTheModelDoes) {
    ServingProcess server(serve_args({"--attention", "ggml"}));
    ASSERT_NE(server.port(), 0) << server.log();
    const uint16_t port = server.port();
    // An answer with its logprobs, then the prompt and that answer scored as one prompt.
    HttpResponse r = complete(
        port, {{"prompt", kPrompt}, {"max_tokens", 6}, {"temperature", 0}, {"logprobs", kTop}});
    ASSERT_EQ(r.status, 200) << r.body;
    const json generated = json::parse(r.body)["choices"][0];
    const std::string answer = generated["text"];
    const std::vector<int32_t> prompt = tokenize(port, kPrompt);
    const std::vector<int32_t> whole = tokenize(port, std::string(kPrompt) + answer);
    ASSERT_GT(whole.size(), prompt.size());
    // Twice: the second finds the prompt in the prefix cache, and still scores all of it.
    json first;
    for (int pass = 0; pass < 2; ++pass) {
        r = complete(port, scored_body(whole, 1));
        ASSERT_EQ(r.status, 200) << r.body;
        const json done = json::parse(r.body);
        EXPECT_EQ(done["usage"]["prompt_tokens"].get<size_t>(), whole.size());
        EXPECT_EQ(done["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
        const json c = done["choices"][0];
        const json& lp = c["logprobs"];
        // The prompt's tokens and the one generated: they spell the echoed text.
        ASSERT_EQ(lp["tokens"].size(), whole.size() + 1) << lp.dump();
        std::string spelled;
        for (const json& t : lp["tokens"]) spelled += t.get<std::string>();
        EXPECT_EQ(spelled, c["text"].get<std::string>());
        EXPECT_EQ(c["text"].get<std::string>().rfind(std::string(kPrompt) + answer, 0), 0u);
        EXPECT_TRUE(lp["token_logprobs"][0].is_null());
        EXPECT_TRUE(lp["top_logprobs"][0].is_null());
        EXPECT_EQ(lp["text_offset"][0], 0);
        for (size_t i = 1; i < lp["tokens"].size(); ++i) {
            const double v = lp["token_logprobs"][i];
            EXPECT_LE(v, 0.0);
            const json& top = lp["top_logprobs"][i];
            EXPECT_GE(top.size(), static_cast<size_t>(kTop) - 1);  // chosen may share a text
            double best = -INFINITY;
            for (const auto& [text, value] : top.items())
                best = std::max(best, value.get<double>());
            EXPECT_GE(best, v - 1e-6);
        }
        if (pass == 0) first = lp;
        if (pass == 1) EXPECT_EQ(lp, first);  // the same values, prefix cache or not
    }
    // The answer's tokens score as a prompt what they scored as generated.
    const json& gen = generated["logprobs"];
    const size_t n = std::min(gen["tokens"].size(), whole.size() - prompt.size());
    for (size_t i = 0; i < n; ++i) {
        EXPECT_EQ(first["tokens"][prompt.size() + i], gen["tokens"][i]) << i;
        EXPECT_NEAR(first["token_logprobs"][prompt.size() + i].get<double>(),
                    gen["token_logprobs"][i].get<double>(), 1e-5)
            << i;
    }

    // Each prompt token's value is the model's own.
    EXPECT_EQ(server.stop(), 0) << server.log();
    std::unique_ptr<model::Model> m(load_default_model());
    ASSERT_NE(m, nullptr);
    const std::vector<double> own = own_scores(*m, whole);
    ASSERT_EQ(own.size(), whole.size() - 1);
    for (size_t i = 0; i < own.size(); ++i)
        EXPECT_NEAR(first["token_logprobs"][i + 1].get<double>(), own[i], 1e-5) << i;
}

TEST_F(ServePromptLogprobsTest, AsVllmListsThem) {
    ServingProcess server(serve_args({}));
    ASSERT_NE(server.port(), 0) << server.log();
    const uint16_t port = server.port();
    const std::vector<int32_t> ids = tokenize(port, kPrompt);
    json body = {
        {"prompt", kPrompt}, {"max_tokens", 1}, {"temperature", 0}, {"prompt_logprobs", 2}};
    HttpResponse r = complete(port, body);
    ASSERT_EQ(r.status, 200) << r.body;
    const json c = json::parse(r.body)["choices"][0];
    EXPECT_TRUE(c["logprobs"].is_null());
    const json& listed = c["prompt_logprobs"];
    ASSERT_EQ(listed.size(), ids.size()) << listed.dump();
    EXPECT_TRUE(listed[0].is_null());
    // The same values as echo's.
    r = complete(port, scored_body(kPrompt, 1));
    ASSERT_EQ(r.status, 200) << r.body;
    const json echoed = json::parse(r.body)["choices"][0]["logprobs"];
    for (size_t i = 1; i < ids.size(); ++i) {
        const json& place = listed[i];
        const std::string own = std::to_string(ids[i]);
        ASSERT_TRUE(place.contains(own)) << place.dump();
        EXPECT_EQ(place[own]["logprob"], echoed["token_logprobs"][i]);
        EXPECT_EQ(place[own]["decoded_token"], echoed["tokens"][i]);
        EXPECT_GE(place[own]["rank"].get<int>(), 1);
        // The prompt's token and the two most likely, ranks 1 and 2 (one entry if it is one).
        EXPECT_LE(place.size(), 3u);
        EXPECT_GE(place.size(), 2u);
        bool ranked_first = false;
        for (const auto& [id, e] : place.items()) {
            EXPECT_LE(e["logprob"].get<double>(), 0.0);
            ranked_first = ranked_first || e["rank"] == 1;
        }
        EXPECT_TRUE(ranked_first) << place.dump();
    }
    // A prompt_logprobs of 0: the prompt's own tokens only; null: none.
    body["prompt_logprobs"] = 0;
    r = complete(port, body);
    ASSERT_EQ(r.status, 200) << r.body;
    for (size_t i = 1; i < ids.size(); ++i)
        EXPECT_EQ(json::parse(r.body)["choices"][0]["prompt_logprobs"][i].size(), 1u);
    body["prompt_logprobs"] = nullptr;
    r = complete(port, body);
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_FALSE(json::parse(r.body)["choices"][0].contains("prompt_logprobs"));

    // Refused by name: streamed, out of range, and on chat.
    const std::pair<json, const char*> refused[] = {
        {{{"prompt", "x"}, {"echo", true}, {"logprobs", 1}, {"stream", true}}, "'echo'"},
        {{{"prompt", "x"}, {"prompt_logprobs", 1}, {"stream", true}}, "'prompt_logprobs'"},
        {{{"prompt", "x"}, {"prompt_logprobs", 21}}, "'prompt_logprobs'"},
        {{{"prompt", "x"}, {"prompt_logprobs", "2"}}, "'prompt_logprobs'"},
    };
    for (const auto& [bad, named] : refused) {
        r = complete(port, bad);
        EXPECT_EQ(r.status, 400) << bad.dump();
        EXPECT_NE(r.body.find(named), std::string::npos) << bad.dump() << ": " << r.body;
    }
    r = post_chat(port, json{{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})},
                             {"prompt_logprobs", 1}});
    EXPECT_EQ(r.status, 400);
    EXPECT_NE(r.body.find("'prompt_logprobs'"), std::string::npos) << r.body;
    EXPECT_EQ(server.stop(), 0) << server.log();
}

TEST_F(ServePromptLogprobsTest, TokenizerInfoAsVllmGivesIt) {
    ServingProcess server(serve_args({}));
    ASSERT_NE(server.port(), 0) << server.log();
    const HttpResponse r = http_request(server.port(), "GET", "/tokenizer_info");
    ASSERT_EQ(r.status, 200) << r.body;
    const json info = json::parse(r.body);
    std::unique_ptr<model::Model> m(load_default_model());
    ASSERT_NE(m, nullptr);
    // lm-eval's remote tokenizer tokenizes these texts back into the ids.
    EXPECT_EQ(tokenize(server.port(), info["eos_token"]),
              std::vector<int32_t>{m->tokenizer->eos_id()});
    EXPECT_EQ(tokenize(server.port(), info["bos_token"]),
              std::vector<int32_t>{m->tokenizer->bos_id()});
    EXPECT_EQ(info["chat_template"], m->chat_template.source());
    EXPECT_EQ(info["model_max_length"], m->config.n_ctx_train);
    EXPECT_EQ(info["add_bos_token"], m->tokenizer->vocab().add_bos);
    EXPECT_EQ(server.stop(), 0) << server.log();
}

}  // namespace
}  // namespace deltaserve::testing
