// Automatic prefix caching in the decode worker (decode/src/prefix_cache.h), on the default
// model: a later prompt that starts as an earlier one did (a stateless conversation sent whole
// again, a shared system prompt) prefills only what is new, reports the rest as cached, and
// answers exactly as without the cache, prefilled here or on a prefill node; the cache keeps
// to its byte budget, dropping the least recently used blocks; policies whose prefixes are
// not exact never use it.
#include <gtest/gtest.h>

#include "decode_turns.h"
#include "default_model.h"
#include "deltaserve/decode/decode_worker.h"
#include "deltaserve/prefill/prefill_worker.h"
#include "deltaserve/transport/transport_factory.h"
#include "test_paths.h"

namespace deltaserve {
namespace {

using decode::TurnEnd;
using decode::TurnSpec;
using testing::CollectingSink;

constexpr int32_t kBlock = 16;  // decode::PrefixCache::kBlockTokens

class PrefixCacheTest : public testing::DefaultModelTest {
  protected:
    // A stateless greedy turn of max_tokens.
    static TurnSpec turn(uint64_t id, std::vector<int32_t> tokens, int32_t max_tokens = 16) {
        return testing::greedy_turn(id, std::move(tokens), "", max_tokens);
    }
    static std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
        a.insert(a.end(), b.begin(), b.end());
        return a;
    }
    // A worker that prefills every prompt itself (local_prefill_max) or none (0), with a
    // prefix cache of cache_bytes; and a prefill worker connected to it.
    void start(size_t cache_bytes, const std::string& policy = "full",
               int32_t local_prefill_max = 100000) {
        decode::DecodeOptions d;
        d.context.n_ctx = 2048;
        d.context.n_threads = 2;
        d.context.n_batch = 256;
        d.context.kv.policy = policy;
        d.context.kv.keep = policy == "full" ? 1.0f : 0.3f;
        d.context.kv_profile = policy == "deltakv" ? testing::default_deltakv_profile() : "";
        d.threads = 2;
        d.local_prefill_max = local_prefill_max;
        d.prefix_cache_bytes = cache_bytes;
        d.model_id = "m";
        prefill_.reset();
        decode_.reset();
        auto dw = decode::DecodeWorker::create(*model_, d);
        ASSERT_TRUE(dw.ok()) << dw.error().to_string();
        decode_ = std::move(*dw);
        if (!transport_) transport_ = std::move(*transport::make_transport("inproc", {}));
        address_ = *decode_->listen(*transport_, "decode-" + std::to_string(++workers_));
        prefill::PrefillOptions p;
        p.context = d.context;
        p.model_id = "m";
        auto pw = prefill::PrefillWorker::create(*model_, p, *transport_);
        ASSERT_TRUE(pw.ok()) << pw.error().to_string();
        prefill_ = std::move(*pw);
    }
    void TearDown() override {
        prefill_.reset();
        decode_.reset();
    }
    // Runs a turn to its end (on the prefill worker too when the plan says so).
    Result<testing::TurnRun> run(const TurnSpec& spec) {
        return testing::run_turn(*decode_, *prefill_, address_, spec);
    }
    // The answers of `prompts` from a worker with no prefix cache.
    std::vector<std::string> uncached_answers(const std::vector<std::vector<int32_t>>& prompts) {
        start(0);
        std::vector<std::string> out;
        for (size_t i = 0; i < prompts.size(); ++i) {
            auto r = run(turn(100 + i, prompts[i]));
            EXPECT_TRUE(r.ok()) << r.status().to_string();
            EXPECT_EQ(r.ok() ? r->end.cached_tokens : -1, 0);
            out.push_back(r.ok() ? r->end.text : "");
        }
        return out;
    }

    std::unique_ptr<transport::Transport> transport_;
    std::unique_ptr<decode::DecodeWorker> decode_;
    std::unique_ptr<prefill::PrefillWorker> prefill_;
    std::string address_;
    int workers_ = 0;
};

// An OpenAI client sends the whole conversation every turn: the second request prefills only
// what the first did not hold, and answers as the whole prompt computed alone.
TEST_F(PrefixCacheTest, AResentConversationPrefillsOnlyItsNewTokens) {
    const auto first = text_tokens(300, 0, true);
    const auto second = concat(first, text_tokens(200, 300));
    const auto alone = uncached_answers({first, second});
    start(size_t{64} << 20);
    auto a = run(turn(1, first));
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    EXPECT_EQ(a->end.cached_tokens, 0);
    EXPECT_EQ(a->end.text, alone[0]);
    auto b = run(turn(2, second));
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    EXPECT_EQ(b->end.cached_tokens, 300 / kBlock * kBlock) << "the first prompt's whole blocks";
    EXPECT_EQ(b->plan.cached_tokens, b->end.cached_tokens);
    EXPECT_EQ(b->end.text, alone[1]) << "the cached prefix changed the answer";
    const auto st = decode_->stats();
    EXPECT_EQ(st.prefix_cache_hit_tokens, b->end.cached_tokens);
    EXPECT_GE(st.prefix_cache_blocks, 500 / kBlock);
    EXPECT_EQ(st.kv_bytes, 0) << "no turn runs; the cache's blocks are counted apart";
    EXPECT_GT(st.prefix_cache_bytes, 0);
}

// The answer's tokens are cached too: the next request carries them back.
TEST_F(PrefixCacheTest, TheAnswerIsCachedForTheNextTurn) {
    const auto first = text_tokens(100, 0, true);
    start(size_t{64} << 20);
    auto sink = std::make_shared<CollectingSink>();
    ASSERT_TRUE(decode_->start_turn(turn(1, first, 40), sink).ok());
    ASSERT_TRUE(sink->wait().ok());
    // The tokens the worker evaluated: the prompt, then every answer token but the last.
    auto encoded = model_->tokenizer->encode(sink->text(), false, false);
    ASSERT_TRUE(encoded.ok());
    const auto answer = *encoded;
    ASSERT_GE(answer.size(), 20u);
    const auto next = concat(concat(first, answer), text_tokens(30, 500));
    auto r = run(turn(2, next));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_GT(r->end.cached_tokens, 100 / kBlock * kBlock) << "blocks of the answer were found";
}

// Many requests behind one system prompt: it is computed once; each answer is its own.
TEST_F(PrefixCacheTest, ASharedSystemPromptIsComputedOnce) {
    const auto system = text_tokens(256, 0, true);
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 4; ++i) prompts.push_back(concat(system, text_tokens(40, 400 + 60 * i)));
    const auto alone = uncached_answers(prompts);
    start(size_t{64} << 20);
    for (size_t i = 0; i < prompts.size(); ++i) {
        auto r = run(turn(1 + i, prompts[i]));
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        EXPECT_EQ(r->end.cached_tokens, i == 0 ? 0 : 256) << "request " << i;
        EXPECT_EQ(r->end.text, alone[i]) << "request " << i;
    }
}

// Requests that come together behind one system prompt: the first computes it, the later
// ones find it when their first chunk comes, not only when they arrived.
TEST_F(PrefixCacheTest, RequestsThatComeTogetherComputeTheirSharedPrefixOnce) {
    const auto system = text_tokens(256, 0, true);
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 4; ++i) prompts.push_back(concat(system, text_tokens(40, 400 + 60 * i)));
    start(size_t{64} << 20);
    std::vector<std::shared_ptr<CollectingSink>> sinks;
    for (size_t i = 0; i < prompts.size(); ++i) {
        sinks.push_back(std::make_shared<CollectingSink>());
        ASSERT_TRUE(decode_->start_turn(turn(1 + i, prompts[i]), sinks.back()).ok());
    }
    int found = 0;
    for (auto& s : sinks) {
        auto end = s->wait();
        ASSERT_TRUE(end.ok()) << end.status().to_string();
        EXPECT_TRUE(end->cached_tokens == 0 || end->cached_tokens == 256) << end->cached_tokens;
        found += end->cached_tokens == 256;
    }
    // A step's budget is 256 prompt tokens, first come first: the first prompt's 296 tokens
    // take two steps, and the second starts in the second; the last two find its blocks.
    EXPECT_GE(found, 2);
}

// A prompt longer than the decode node prefills itself goes to a prefill node, which pulls
// the cached prefix from the decode node and prefills only the rest.
TEST_F(PrefixCacheTest, APrefillNodePullsTheCachedPrefix) {
    const auto system = text_tokens(320, 0, true);
    const auto p1 = concat(system, text_tokens(50, 500));
    const auto p2 = concat(system, text_tokens(50, 600));
    const auto alone = uncached_answers({p1, p2});
    start(size_t{64} << 20, "full", 0);
    auto a = run(turn(1, p1));
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    EXPECT_TRUE(a->plan.remote_prefill);
    EXPECT_EQ(a->plan.pull_tokens, 0);
    auto b = run(turn(2, p2));
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    EXPECT_TRUE(b->plan.remote_prefill);
    EXPECT_EQ(b->end.cached_tokens, 320);
    EXPECT_EQ(b->plan.pull_tokens, 320);
    EXPECT_EQ(a->end.text, alone[0]);
    EXPECT_EQ(b->end.text, alone[1]);
    EXPECT_EQ(prefill_->stats().requests, 2);
}

// The cache keeps to its budget: the least recently used prompts go; a prompt used again
// stays; what a turn ended or cancelled left is not held by anything else.
TEST_F(PrefixCacheTest, TheBudgetHoldsAndTheLeastRecentlyUsedGo) {
    // Bytes of one block: every layer's K and V rows of 16 tokens, fp16.
    const size_t block =
        static_cast<size_t>(kBlock) * model_->config.n_layers * model_->config.kv_dim() * 2 * 2;
    start(block * 20);  // 20 blocks: two prompts and a half
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 4; ++i) prompts.push_back(text_tokens(129, 200 * i, true));
    uint64_t id = 1;
    for (const auto& p : prompts) {
        auto r = run(turn(id++, p, 1));  // 129 tokens, one answer token: 8 whole blocks
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        EXPECT_LE(decode_->stats().prefix_cache_bytes, static_cast<int64_t>(block * 20));
    }
    // 32 blocks came; the 12 least recently used went, the deepest of a prompt first: prompt
    // 0 entirely, prompt 1's last 4.
    EXPECT_EQ(decode_->stats().prefix_cache_blocks, 20);
    for (int i : {3, 2, 0}) {
        auto r = run(turn(id++, prompts[i], 1));
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        EXPECT_EQ(r->end.cached_tokens, i >= 2 ? 128 : 0) << "prompt " << i;
    }
    // Prompt 0 came back: prompt 1's blocks went, then the last 4 of prompt 3 (the least
    // recently used now).
    for (auto [i, cached] : {std::pair{3, 64}, std::pair{1, 0}}) {
        auto r = run(turn(id++, prompts[i], 1));
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        EXPECT_EQ(r->end.cached_tokens, cached) << "prompt " << i;
    }
    // A turn cancelled by its client leaves no KV held beside the cache's budget.
    auto quitter = std::make_shared<CollectingSink>(3);
    ASSERT_TRUE(decode_->start_turn(turn(id++, prompts[1], 100), quitter).ok());
    auto end = quitter->wait();
    ASSERT_TRUE(end.ok());
    EXPECT_EQ(end->finish_reason, "cancelled");
    const auto st = decode_->stats();
    EXPECT_EQ(st.running + st.waiting, 0);
    EXPECT_EQ(st.kv_bytes, 0);
    EXPECT_LE(st.prefix_cache_bytes, static_cast<int64_t>(block * 20));
}

// A session this worker holds nothing of (new, or dropped) starts from the cache too.
TEST_F(PrefixCacheTest, ANewSessionStartsFromTheCache) {
    const auto system = text_tokens(200, 0, true);
    start(size_t{64} << 20);
    ASSERT_TRUE(run(turn(1, concat(system, text_tokens(20, 300)))).ok());
    auto r = run(testing::greedy_turn(2, concat(system, text_tokens(20, 400)), "s", 8));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->end.cached_tokens, 192);
    EXPECT_EQ(decode_->stats().sessions, 1);
}

// Scopes (tenants) never meet: a prompt finds only what its own scope cached.
TEST_F(PrefixCacheTest, AScopeFindsOnlyItsOwnPrefixes) {
    const auto p = text_tokens(100, 0, true);
    start(size_t{64} << 20);
    auto scoped = [&](uint64_t id, const std::string& scope) {
        auto spec = turn(id, p, 1);
        spec.cache_scope = scope;
        auto r = run(spec);
        EXPECT_TRUE(r.ok()) << r.status().to_string();
        return r.ok() ? r->end.cached_tokens : -1;
    };
    EXPECT_EQ(scoped(1, "tenant-a"), 0);
    EXPECT_EQ(scoped(2, "tenant-b"), 0);
    EXPECT_EQ(scoped(3, ""), 0);
    EXPECT_EQ(scoped(4, "tenant-a"), 96);
    EXPECT_EQ(scoped(5, ""), 96);
    auto big = turn(6, p);
    big.cache_scope = std::string(257, 'x');
    EXPECT_EQ(decode_->start_turn(big, std::make_shared<CollectingSink>()).status().code(),
              StatusCode::kInvalidArgument);
}

// DeltaKV's state at a prefix depends on what came after it (what was compressed when):
// the worker never matches prefixes across prompts with it.
TEST_F(PrefixCacheTest, DeltaKvDoesNotSharePrefixes) {
    DS_REQUIRE_FILE(testing::default_deltakv_profile(), "the default model's DeltaKV profile");
    const auto system = text_tokens(256, 0, true);
    start(size_t{64} << 20, "deltakv");
    for (int i = 0; i < 2; ++i) {
        auto r = run(turn(1 + i, concat(system, text_tokens(40, 400 + 60 * i))));
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        EXPECT_EQ(r->end.cached_tokens, 0);
    }
    EXPECT_EQ(decode_->stats().prefix_cache_blocks, 0);
}

}  // namespace
}  // namespace deltaserve
