// KV policies in the real forward pass (SmolLM2): a prompt evaluated in one call sees every
// token whatever the policy, so its logits equal full KV's exactly (this checks the
// per-head layout end to end); afterwards the cache holds the keep ratio and decoding
// continues from what was kept.
#include <gtest/gtest.h>

#include <cmath>

#include "default_model.h"
#include "deltaserve/kvstore/kv_policy.h"
#include "deltaserve/model/inference_context.h"
#include "deltaserve/model/sampler.h"
#include "test_paths.h"

namespace deltaserve::model {
namespace {

constexpr const char* kText =
    "The lighthouse keeper climbed the narrow stairs every evening at dusk. He carried a small "
    "lamp, a notebook and a flask of tea. From the top he could see the harbour, the fishing "
    "boats returning with their catch, and the long line of cliffs that stretched away to the "
    "north. He wrote down the weather, the ships he saw and anything unusual. One night, a "
    "storm came in from the sea and the light flickered. He worked until morning to keep it";

class KvPolicyTest : public ::testing::TestWithParam<std::string> {
  protected:
    static void SetUpTestSuite() { model_ = testing::load_default_model(); }
    static void TearDownTestSuite() { delete model_; }
    void SetUp() override { DS_REQUIRE_FILE(testing::default_gguf_model(), "default model"); }

    static std::unique_ptr<InferenceContext> context(const std::string& policy, float keep) {
        ContextOptions co;
        co.n_ctx = 512;
        co.n_threads = 2;
        co.kv.policy = policy;
        co.kv.keep = keep;
        if (policy == "trimkv") co.kv_profile = testing::default_trimkv_gates();
        auto ctx = InferenceContext::create(*model_, co);
        EXPECT_TRUE(ctx.ok()) << ctx.error().to_string();
        return ctx.ok() ? std::move(*ctx) : nullptr;
    }
    static Model* model_;
};
Model* KvPolicyTest::model_ = nullptr;

TEST_P(KvPolicyTest, PromptLogitsExactThenKeepRatioHeld) {
    if (GetParam() == "trimkv")
        DS_REQUIRE_FILE(testing::default_trimkv_gates(), "TRIM-KV gates (setup trains them)");
    auto tokens = model_->tokenizer->encode(kText, false, false);
    ASSERT_TRUE(tokens.ok());
    ASSERT_GT(tokens->size(), 64u);
    auto full = context("full", 1.0f);
    auto pol = context(GetParam(), 0.5f);
    ASSERT_TRUE(full && pol);
    auto lf = full->eval(*tokens);
    ASSERT_TRUE(lf.ok());
    const std::vector<float> full_logits(lf->begin(), lf->end());
    auto lp = pol->eval(*tokens);
    ASSERT_TRUE(lp.ok());
    EXPECT_EQ(std::vector<float>(lp->begin(), lp->end()), full_logits);
    EXPECT_LE(pol->keep_ratio(), 0.5);
    EXPECT_GT(pol->keep_ratio(), 0.45);
    EXPECT_DOUBLE_EQ(full->keep_ratio(), 1.0);

    // Decoding goes on over the kept tokens: finite logits, and the same greedy choice as
    // full KV for most steps on this easy text (a cache that lost its data would not).
    int32_t next = greedy(*lp), agree = 0;
    for (int i = 0; i < 12; ++i) {
        auto a = full->eval(std::span<const int32_t>(&next, 1));
        auto b = pol->eval(std::span<const int32_t>(&next, 1));
        ASSERT_TRUE(a.ok() && b.ok());
        for (float x : *b) ASSERT_TRUE(std::isfinite(x));
        agree += greedy(*a) == greedy(*b);
        next = greedy(*a);
    }
    EXPECT_GE(agree, 6) << GetParam();
    EXPECT_LT(pol->kv_bytes(), full->kv_bytes());
}

INSTANTIATE_TEST_SUITE_P(Policies, KvPolicyTest,
                         ::testing::Values("streaming", "h2o", "snapkv", "keydiff", "kvcompress",
                                           "d2o", "trimkv"));

TEST_F(KvPolicyTest, BadPolicyOptionsAreRejected) {
    ContextOptions co;
    co.kv.policy = "nonsense";
    EXPECT_EQ(InferenceContext::create(*model_, co).status().code(), StatusCode::kInvalidArgument);
    co.kv.policy = "full";
    co.kv.keep = 0.5f;
    EXPECT_EQ(InferenceContext::create(*model_, co).status().code(), StatusCode::kInvalidArgument);
    co.kv.policy = "h2o";
    co.attention = AttentionNumerics::kGgml;
    EXPECT_EQ(InferenceContext::create(*model_, co).status().code(), StatusCode::kInvalidArgument);
}

// What the registry (kvstore/kv_policy.h) declares is what each policy's cache does: the
// decode worker ships, pages and shares by it.
TEST_F(KvPolicyTest, EveryPolicyDoesWhatTheRegistryDeclares) {
    const auto tokens = testing::license_tokens(*model_, 200, 0, true);
    for (const kvstore::KvPolicyInfo& p : kvstore::kv_policies()) {
        ContextOptions co;
        co.n_ctx = 512;
        co.n_threads = 2;
        co.kv.policy = std::string(p.name);
        co.kv.keep = p.compresses ? 0.3f : 1.0f;
        if (p.name == "deltakv") co.kv_profile = testing::default_deltakv_profile();
        if (p.name == "trimkv") co.kv_profile = testing::default_trimkv_gates();
        auto ctx = InferenceContext::create(*model_, co);
        ASSERT_TRUE(ctx.ok()) << p.name << ": " << ctx.error().to_string();
        ASSERT_TRUE((*ctx)->eval(tokens).ok()) << p.name;
        EXPECT_EQ((*ctx)->export_kv_state().ok(), p.shippable) << p.name;
        EXPECT_EQ((*ctx)->kv_block_pool() != nullptr, p.paged) << p.name;
        EXPECT_EQ(!(*ctx)->kv_blocks(200 / 16).empty(), p.paged) << p.name;
        EXPECT_EQ((*ctx)->keep_ratio() < 0.9, p.compresses) << p.name;
        EXPECT_GE((*ctx)->kv_bytes_bound(200), (*ctx)->kv_bytes()) << p.name;
        co.attention = AttentionNumerics::kGgml;
        EXPECT_EQ(InferenceContext::create(*model_, co).ok(), p.ggml_attention) << p.name;
    }
}

}  // namespace
}  // namespace deltaserve::model
