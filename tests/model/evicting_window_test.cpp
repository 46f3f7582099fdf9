// The evicting policies past a sliding window, on make_test_models.py's random gemma3 (5 local
// layers of window 48, one global): an evicting cache that keeps every global token attends
// what the full policy's does, chunk after chunk and step after step; a prompt in one call
// gives the full policy's logits with every policy; at keep 0.5 each runs well past the window
// and holds the global layers' budget and the local layers' windows, not the context.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "deltaserve/kvstore/evicting_cache.h"
#include "deltaserve/kvstore/kv_cache.h"
#include "deltaserve/model/forward.h"
#include "deltaserve/model/inference_context.h"
#include "deltaserve/model/model.h"
#include "test_models.h"

namespace deltaserve::model {
namespace {

namespace fs = std::filesystem;
constexpr int32_t kWindow = 48;
constexpr int32_t kSlack = kvstore::EvictingSequenceCache::kWindowSlack;
const std::vector<std::string> kPolicies = {"streaming",  "h2o", "snapkv", "keydiff",
                                            "kvcompress", "d2o", "trimkv"};

// Ranks by attention (so the cache gathers it) and keeps every entry.
class KeepEvery final : public kvstore::EvictionPolicy {
  public:
    const char* name() const override { return "keep-every"; }
    kvstore::AttentionStat stat() const override { return kvstore::AttentionStat::kAllQueries; }
    void select(const kvstore::UnitView& u, int32_t, std::vector<uint8_t>& keep) const override {
        std::fill(keep.begin(), keep.begin() + u.n, 1);
    }
    std::vector<int32_t> budgets(const std::vector<const kvstore::UnitView*>& units,
                                 int64_t) const override {
        std::vector<int32_t> out;
        for (const auto* u : units) out.push_back(u->n);
        return out;
    }
};

std::vector<int32_t> prompt(int32_t n) {
    std::vector<int32_t> t;
    for (int32_t i = 0; i < n; ++i) t.push_back(1 + (i * 7919) % 4000);
    return t;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    double worst = a.size() == b.size() ? 0.0 : INFINITY;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
        worst = std::max(worst, double(std::fabs(a[i] - b[i])));
    return worst;
}

class EvictingWindow : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        if (!testing::file_exists(testing::default_gguf_model()) ||
            !testing::file_exists(testing::tools_python()))
            return;
        if (dir().empty()) return;
        LoadOptions lo;
        lo.show_progress = false;
        auto m = load_model(dir() + "/gemma3-f32.gguf", lo);
        if (m.ok()) model_ = m->release();
    }
    static void TearDownTestSuite() {
        delete model_;
        model_ = nullptr;
    }
    void SetUp() override {
        DS_REQUIRE_TEST_MODEL_TOOLS();
        ASSERT_FALSE(dir().empty()) << testing::test_models(/*only_bad=*/false).why;
        ASSERT_NE(model_, nullptr);
        ASSERT_EQ(model_->config.sliding_window, kWindow);
    }
    // Random TRIM-KV gates for the model (retention around 0.9).
    static std::shared_ptr<const kvstore::RetentionGates> gates() {
        const ModelConfig& c = model_->config;
        auto g = std::make_shared<kvstore::RetentionGates>();
        g->d_model = c.d_model;
        g->hidden = 8;
        g->n_kv_heads = c.n_kv_heads;
        std::mt19937 rng(5);
        std::normal_distribution<float> nd(0.0f, 0.1f);
        for (int32_t l = 0; l < c.n_layers; ++l) {
            kvstore::RetentionGates::Layer w;
            for (int32_t i = 0; i < 8 * c.d_model; ++i) w.w1.push_back(nd(rng));
            w.b1.assign(8, 0.0f);
            for (int32_t i = 0; i < c.n_kv_heads * 8; ++i) w.w2.push_back(nd(rng));
            w.b2.assign(static_cast<size_t>(c.n_kv_heads), 2.0f);
            g->layers.push_back(w);
        }
        return g;
    }
    static std::unique_ptr<InferenceContext> context(const std::string& policy, float keep,
                                                     int32_t n_batch) {
        ContextOptions co;
        co.n_ctx = 512;
        co.n_batch = n_batch;
        co.n_threads = 2;
        co.kv_type = KvType::kF32;
        co.kv.policy = policy;
        co.kv.keep = keep;
        if (policy == "trimkv") co.kv.gates = gates();
        auto ctx = InferenceContext::create(*model_, co);
        EXPECT_TRUE(ctx.ok()) << policy << ": " << ctx.error().to_string();
        return ctx.ok() ? std::move(*ctx) : nullptr;
    }
    static const std::string& dir() { return testing::test_models(/*only_bad=*/false).dir; }
    static Model* model_;
};
Model* EvictingWindow::model_ = nullptr;

// 300 tokens in chunks of 16, then 8 steps: the local layers drop what their window left
// (each holds 47 + 64 positions at the end), the global one keeps every token, and every
// logit is the full policy's.
TEST_F(EvictingWindow, KeepingEveryGlobalTokenIsTheFullPolicy) {
    const ModelConfig& c = model_->config;
    auto full = context("full", 1.0f, 16);
    ASSERT_NE(full, nullptr);
    auto pool = kvstore::HeadSlotPool::create(
        {c.n_layers, c.n_kv_heads, c.head_dim, 512, kernels::DType::kF32});
    ASSERT_TRUE(pool.ok());
    std::vector<bool> local(static_cast<size_t>(c.n_layers));
    for (int32_t l = 0; l < c.n_layers; ++l) local[l] = c.is_local(l);
    kvstore::EvictingSequenceCache cache(**pool, std::make_unique<KeepEvery>(), {}, local, kWindow);
    ThreadPool threads(2);
    Forward forward(*model_, threads);
    const auto tokens = prompt(300);
    std::vector<float> want, got, logits;
    for (size_t i = 0; i < tokens.size(); i += 16) {
        const auto part =
            std::span<const int32_t>(tokens).subspan(i, std::min<size_t>(16, tokens.size() - i));
        auto a = full->eval_all(part);
        ASSERT_TRUE(a.ok()) << a.error().to_string();
        want.insert(want.end(), a->begin(), a->end());
        const SequenceInput in{&cache, part, true};
        ASSERT_TRUE(forward.run(std::span(&in, 1), logits).ok());
        got.insert(got.end(), logits.begin(), logits.end());
    }
    for (int32_t step = 0; step < 8; ++step) {
        const std::vector<float> last(want.end() - c.n_vocab, want.end());
        const int32_t next[] = {
            static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin())};
        auto a = full->eval_all(next);
        ASSERT_TRUE(a.ok());
        want.insert(want.end(), a->begin(), a->end());
        const SequenceInput in{&cache, next, true};
        ASSERT_TRUE(forward.run(std::span(&in, 1), logits).ok());
        got.insert(got.end(), logits.begin(), logits.end());
    }
    const double worst = max_diff(got, want);
    EXPECT_LT(worst, 1e-4);
    for (int32_t l = 0; l < c.n_layers; ++l) {
        EXPECT_EQ(static_cast<int32_t>(cache.positions(l, 0).size()),
                  c.is_local(l) ? kWindow - 1 + kSlack : 308)
            << l;
    }
    std::printf(
        "every global token kept, 308 tokens past a window of 48: max |logit - full| = "
        "%.3g\n",
        worst);
}

// A prompt in one call: before its commit no policy has evicted anything, and each query of
// a local layer sees its window, as the full policy's.
TEST_F(EvictingWindow, APromptInOneCallIsTheFullPolicysWithEveryPolicy) {
    const auto tokens = prompt(200);
    auto full = context("full", 1.0f, 256);
    ASSERT_NE(full, nullptr);
    auto want = full->eval_all(tokens);
    ASSERT_TRUE(want.ok());
    for (const std::string& p : kPolicies) {
        auto ctx = context(p, 1.0f, 256);
        ASSERT_NE(ctx, nullptr);
        auto got = ctx->eval_all(tokens);
        ASSERT_TRUE(got.ok()) << p << ": " << got.error().to_string();
        EXPECT_LT(max_diff(*got, *want), 1e-4) << p;
    }
}

// Keep 0.5, 400 tokens in chunks of 16, then 20 steps: each policy runs, its logits finite,
// and it holds half of the global layer's fp16 bytes and the local layers' windows (after the
// prompt; after the steps too but for SnapKV, which compresses prompts only).
TEST_F(EvictingWindow, EveryPolicyRunsPastTheWindowHoldingItsBudgetAndTheWindows) {
    const ModelConfig& c = model_->config;
    // One global layer at the keep ratio, five local ones at their window and slack (f32 K and
    // V, slot id, position, perhaps a statistic), and each unit's policy state.
    const size_t entry = 2 * 4 * static_cast<size_t>(c.head_dim) + 8;
    const size_t units = static_cast<size_t>(c.n_layers * c.n_kv_heads);
    const size_t local = 5 * static_cast<size_t>(c.n_kv_heads) * (kWindow - 1 + kSlack);
    const auto check = [&](const InferenceContext& ctx, const std::string& p) {
        const int32_t n = ctx.n_past();
        const size_t global = kvstore::full_fp16_bytes(n, 1, c.kv_dim()) / 2;
        EXPECT_LE(ctx.kv_bytes(), global + local * (entry + 4) + units * sizeof(float)) << p;
        EXPECT_GT(ctx.kv_bytes(), local * entry) << p;
        EXPECT_LE(ctx.kv_bytes(), ctx.kv_bytes_bound(n)) << p;
    };
    for (const std::string& p : kPolicies) {
        auto ctx = context(p, 0.5f, 16);
        ASSERT_NE(ctx, nullptr);
        auto l = ctx->eval(prompt(400));
        ASSERT_TRUE(l.ok()) << p << ": " << l.error().to_string();
        check(*ctx, p);
        for (int32_t step = 0; step < 20; ++step) {
            const int32_t next[] = {
                static_cast<int32_t>(std::max_element(l->begin(), l->end()) - l->begin())};
            l = ctx->eval(next);
            ASSERT_TRUE(l.ok()) << p;
            for (float x : *l) ASSERT_TRUE(std::isfinite(x)) << p;
        }
        if (p != "snapkv") check(*ctx, p);
        std::printf("%-10s %d tokens at keep 0.5: %zu KV bytes, keep_ratio %.3f\n", p.c_str(),
                    ctx->n_past(), ctx->kv_bytes(), ctx->keep_ratio());
    }
}

}  // namespace
}  // namespace deltaserve::model
