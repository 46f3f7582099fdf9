// n > 1 through deltaserve serve, as OpenAI and vLLM answer it: n choices at their indexes,
// usage with the prompt once and every choice's tokens, the same choices for the same seed,
// greedy choices all the single answer; the prompt computed once (the other choices take
// its whole blocks from the prefix cache: /metrics counts them); streaming, sessions and
// more than 16 choices refused naming n.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <regex>
#include <set>

#include "deltaserve/kvstore/block_pool.h"
#include "http_client.h"
#include "serving.h"
#include "test_paths.h"

namespace deltaserve::testing {
namespace {

class ServeChoicesTest : public ::testing::Test {
  protected:
    void SetUp() override { DS_REQUIRE_FILE(default_gguf_model(), "default GGUF model"); }
};

HttpResponse complete(uint16_t port, const json& body) {
    return http_request(port, "POST", "/v1/completions", body.dump());
}

int64_t prefix_cached(uint16_t port) {
    const HttpResponse r = http_request(port, "GET", "/metrics");
    EXPECT_EQ(r.status, 200);
    std::smatch m;
    static const std::regex line(R"(deltaserve_cached_tokens_total\{source="prefix"\} (\d+))");
    return std::regex_search(r.body, m, line) ? std::stoll(m[1]) : -1;
}

TEST_F(ServeChoicesTest, ChoicesShareThePrompt) {
    ServingProcess server(serve_args({}));
    ASSERT_NE(server.port(), 0) << server.log();
    const uint16_t port = server.port();
    std::string prompt;
    for (int i = 0; i < 5; ++i) prompt += "A lighthouse keeper finds a message in a bottle. ";
    const json body = {{"prompt", prompt}, {"max_tokens", 10}, {"temperature", 0.9},
                       {"seed", 7},        {"n", 4},           {"logprobs", 1}};
    const int64_t before = prefix_cached(port);
    HttpResponse r = complete(port, body);
    ASSERT_EQ(r.status, 200) << r.body;
    const json a = json::parse(r.body);
    ASSERT_EQ(a["choices"].size(), 4u) << r.body;
    int64_t tokens = 0;
    for (size_t i = 0; i < 4; ++i) {
        const json& c = a["choices"][i];
        EXPECT_EQ(c["index"], i);
        EXPECT_EQ(c["finish_reason"], "length");
        EXPECT_FALSE(c["text"].get<std::string>().empty());
        tokens += static_cast<int64_t>(c["logprobs"]["tokens"].size());
    }
    EXPECT_EQ(a["usage"]["completion_tokens"], tokens);
    const int64_t n_prompt = a["usage"]["prompt_tokens"];
    EXPECT_EQ(a["usage"]["total_tokens"], n_prompt + tokens);
    // Choices 1-3 took the prompt's whole blocks (all but its last token at least is
    // computed) from the prefix cache choice 0 filled.
    const int64_t block = kvstore::BlockPool::kBlockTokens;
    EXPECT_EQ(prefix_cached(port) - before, 3 * ((n_prompt - 1) / block * block));

    // At temperature 0.9 four choices differ somewhere; the same seed gives the same four.
    std::set<std::string> texts;
    for (const json& c : a["choices"]) texts.insert(c["text"].get<std::string>());
    EXPECT_GT(texts.size(), 1u) << r.body;
    r = complete(port, body);
    ASSERT_EQ(r.status, 200) << r.body;
    for (size_t i = 0; i < 4; ++i)
        EXPECT_EQ(json::parse(r.body)["choices"][i]["text"], a["choices"][i]["text"]) << i;

    // Greedy: every choice is the single answer, on chat too.
    json chat = chat_body("Name a colour.", 8);
    r = post_chat(port, chat);
    ASSERT_EQ(r.status, 200) << r.body;
    const json one = json::parse(r.body)["choices"][0]["message"];
    chat["n"] = 3;
    r = post_chat(port, chat);
    ASSERT_EQ(r.status, 200) << r.body;
    const json three = json::parse(r.body);
    ASSERT_EQ(three["choices"].size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
        EXPECT_EQ(three["choices"][i]["index"], i);
        EXPECT_EQ(three["choices"][i]["message"], one) << i;
    }
    EXPECT_EQ(server.stop(), 0) << server.log();
}

TEST_F(ServeChoicesTest, WhatItDoesNotServeIsRefused) {
    ServingProcess server(serve_args({}));
    ASSERT_NE(server.port(), 0) << server.log();
    const uint16_t port = server.port();
    json chat = chat_body("hi", 4);
    chat["n"] = 17;
    HttpResponse r = post_chat(port, chat);
    EXPECT_EQ(r.status, 400);
    EXPECT_NE(r.body.find("'n'"), std::string::npos) << r.body;
    chat["n"] = 2;
    chat["stream"] = true;
    r = post_chat(port, chat);
    EXPECT_EQ(r.status, 400);
    EXPECT_NE(r.body.find("'n'"), std::string::npos) << r.body;
    chat.erase("stream");
    r = post_chat(port, chat, "X-Session-ID: s1\r\n");
    EXPECT_EQ(r.status, 400);
    EXPECT_NE(r.body.find("'n'"), std::string::npos) << r.body;
    r = complete(port, {{"prompt", "x"}, {"n", 2}, {"stream", true}});
    EXPECT_EQ(r.status, 400);
    EXPECT_NE(r.body.find("'n'"), std::string::npos) << r.body;
    EXPECT_EQ(server.stop(), 0) << server.log();
}

}  // namespace
}  // namespace deltaserve::testing
