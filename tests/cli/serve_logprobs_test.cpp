// logprobs / top_logprobs through deltaserve serve, as OpenAI clients read them: each answer
// token's log-probability and its most likely alternatives, equal to the model's own
// distribution (the same prompt evaluated here, in the test), the same streamed or whole and
// whether the prompt was prefilled by the decode worker or shipped from the prefill worker;
// bad values a 400 naming the field.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <memory>

#include "default_model.h"
#include "deltaserve/model/model.h"
#include "deltaserve/model/scoring.h"
#include "http_client.h"
#include "serving.h"
#include "test_paths.h"

namespace deltaserve::testing {
namespace {

const json kMessages = json::array({{{"role", "user"}, {"content", "Name three colours."}}});
constexpr int kTokens = 12;
constexpr int kTop = 5;

class ServeLogprobsTest : public ::testing::Test {
  protected:
    void SetUp() override { DS_REQUIRE_FILE(default_gguf_model(), "default GGUF model"); }
};

json logprobs_body(bool stream) {
    json b = chat_body("", kTokens);
    b["messages"] = kMessages;
    b["temperature"] = 0;
    b["logprobs"] = true;
    b["top_logprobs"] = kTop;
    b["stream"] = stream;
    return b;
}

std::string bytes_of(const json& entry) {
    std::string out;
    for (const json& b : entry["bytes"]) out += static_cast<char>(b.get<int>());
    return out;
}

// The answer's content and its logprobs' entries: whole, or gathered from the stream's
// chunks.
struct Answer {
    std::string content;
    json entries = json::array();
};

Answer answer_of(const HttpResponse& r, bool stream) {
    Answer a;
    if (!stream) {
        const json j = json::parse(r.body);
        a.content = j["choices"][0]["message"]["content"];
        a.entries = j["choices"][0]["logprobs"]["content"];
        return a;
    }
    size_t at = 0;
    while ((at = r.body.find("data: {", at)) != std::string::npos) {
        const size_t end = r.body.find("\n\n", at);
        const json chunk = json::parse(r.body.substr(at + 6, end - at - 6));
        at = end;
        if (chunk["choices"].empty()) continue;
        const json& c = chunk["choices"][0];
        if (c["delta"].contains("content")) a.content += c["delta"]["content"].get<std::string>();
        if (!c["logprobs"].is_null()) {
            for (const json& e : c["logprobs"]["content"]) a.entries.push_back(e);
        }
    }
    return a;
}

// What a client checks of any answer: the tokens' bytes make its text; each top list is
// sorted, holds the token the greedy answer took first, and is a part of a distribution.
void check_consistent(const Answer& a) {
    ASSERT_FALSE(a.entries.empty());
    std::string text;
    for (const json& e : a.entries) {
        text += bytes_of(e);
        ASSERT_EQ(e["top_logprobs"].size(), static_cast<size_t>(kTop)) << e.dump();
        EXPECT_LE(e["logprob"].get<double>(), 0.0);
        const json& top = e["top_logprobs"];
        EXPECT_EQ(bytes_of(top[0]), bytes_of(e)) << "greedy takes the most likely token";
        EXPECT_NEAR(top[0]["logprob"].get<double>(), e["logprob"].get<double>(), 1e-6);
        double mass = 0;
        for (size_t i = 0; i < top.size(); ++i) {
            mass += std::exp(top[i]["logprob"].get<double>());
            if (i > 0) EXPECT_LE(top[i]["logprob"], top[i - 1]["logprob"]);
        }
        EXPECT_LE(mass, 1.0 + 1e-4);
    }
    EXPECT_EQ(text, a.content);
}

TEST_F(ServeLogprobsTest, TheModelsOwnDistribution) {
    ServingProcess server(serve_args({}));
    ASSERT_NE(server.port(), 0) << server.log();
    const uint16_t port = server.port();
    HttpResponse r = post_chat(port, logprobs_body(false));
    ASSERT_EQ(r.status, 200) << r.body;
    const Answer served = answer_of(r, false);
    check_consistent(served);

    // The same prompt's ids, evaluated here: greedy, token by token.
    r = http_request(port, "POST", "/tokenize", json{{"messages", kMessages}}.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    const std::vector<int32_t> prompt = json::parse(r.body)["tokens"];
    EXPECT_EQ(server.stop(), 0) << server.log();
    std::unique_ptr<model::Model> m(load_default_model());
    ASSERT_NE(m, nullptr);
    const std::vector<GreedyStep> own = greedy_steps(*m, prompt, kTokens);
    ASSERT_EQ(own.size(), static_cast<size_t>(kTokens));
    ASSERT_LE(served.entries.size(), own.size());  // fewer where the answer ended
    const model::Tokenizer& tok = *m->tokenizer;
    int32_t prev = prompt.back();
    const int32_t nv = m->config.n_vocab;
    size_t compared = 0;
    for (; compared < served.entries.size(); ++compared) {
        const json& e = served.entries[compared];
        std::vector<double> lp;
        model::log_softmax(own[compared].logits.data(), nv, lp);
        std::vector<int32_t> order(static_cast<size_t>(nv));
        for (int32_t i = 0; i < nv; ++i) order[static_cast<size_t>(i)] = i;
        std::partial_sort(
            order.begin(), order.begin() + kTop, order.end(),
            [&](int32_t a, int32_t b) { return lp[a] > lp[b] || (lp[a] == lp[b] && a < b); });
        const json& top = e["top_logprobs"];
        for (int i = 0; i < kTop; ++i) {
            const int32_t id = order[static_cast<size_t>(i)];
            // Ranks two near-equal tokens may swap between two evaluations' rounding.
            EXPECT_NEAR(top[i]["logprob"].get<double>(), lp[id], 5e-3) << "rank " << i;
            if (i == 0 || lp[order[i - 1]] - lp[id] > 1e-2) {
                EXPECT_EQ(bytes_of(top[i]), tok.token_to_piece(id, prev, true)) << "rank " << i;
            }
        }
        const int32_t next = own[compared].token;
        if (bytes_of(e) != tok.token_to_piece(next, prev, true)) break;  // a near tie
        prev = next;
    }
    // The two continuations part only at a near tie: most of the answer is compared.
    EXPECT_GT(compared, served.entries.size() / 2);
}

TEST_F(ServeLogprobsTest, StreamedAndPrefilledElsewhereTheSame) {
    ServingProcess here(serve_args({}));
    ASSERT_NE(here.port(), 0) << here.log();
    HttpResponse r = post_chat(here.port(), logprobs_body(false));
    ASSERT_EQ(r.status, 200) << r.body;
    const Answer whole = answer_of(r, false);
    r = post_chat(here.port(), logprobs_body(true));
    ASSERT_EQ(r.status, 200) << r.body;
    const Answer streamed = answer_of(r, true);
    check_consistent(streamed);
    EXPECT_EQ(streamed.content, whole.content);
    EXPECT_EQ(streamed.entries, whole.entries);
    EXPECT_EQ(here.stop(), 0) << here.log();

    // Every prompt shipped from the prefill worker: its first token's logprobs come with the
    // KV.
    ServingProcess shipped(serve_args({"--local-prefill-max", "0"}));
    ASSERT_NE(shipped.port(), 0) << shipped.log();
    r = post_chat(shipped.port(), logprobs_body(false));
    ASSERT_EQ(r.status, 200) << r.body;
    const Answer remote = answer_of(r, false);
    check_consistent(remote);
    ASSERT_EQ(remote.entries.size(), whole.entries.size());
    EXPECT_EQ(bytes_of(remote.entries[0]), bytes_of(whole.entries[0]));
    EXPECT_NEAR(remote.entries[0]["logprob"].get<double>(),
                whole.entries[0]["logprob"].get<double>(), 5e-3);
    EXPECT_EQ(shipped.stop(), 0) << shipped.log();
}

TEST_F(ServeLogprobsTest, BadValuesNameTheField) {
    ServingProcess server(serve_args({}));
    ASSERT_NE(server.port(), 0) << server.log();
    const std::pair<json, const char*> cases[] = {
        {{{"logprobs", "yes"}}, "'logprobs'"},
        {{{"logprobs", true}, {"top_logprobs", 21}}, "'top_logprobs'"},
        {{{"logprobs", true}, {"top_logprobs", -1}}, "'top_logprobs'"},
        {{{"top_logprobs", 3}}, "'top_logprobs' needs logprobs"},
    };
    for (const auto& [fields, named] : cases) {
        json b = chat_body("", 2);
        b.update(fields);
        const HttpResponse r = post_chat(server.port(), b);
        EXPECT_EQ(r.status, 400) << fields.dump();
        EXPECT_NE(r.body.find(named), std::string::npos) << r.body;
    }
    // Without logprobs the answer says null, as OpenAI's does.
    const HttpResponse r = post_chat(server.port(), chat_body("", 2));
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_TRUE(json::parse(r.body)["choices"][0]["logprobs"].is_null());
    EXPECT_EQ(server.stop(), 0) << server.log();
}

}  // namespace
}  // namespace deltaserve::testing
