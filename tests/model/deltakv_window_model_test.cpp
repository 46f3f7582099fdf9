// DeltaKV on Gemma 3 270M past its window of 512 (setup fetches the model, deploy/profile.sh
// calibrates its profile on the 3 global layers): the 15 local layers keep their windows
// exact, the global layers compress, the text's perplexity stays near full KV's, and the
// session ships and comes back exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include "deltaserve/model/inference_context.h"
#include "deltaserve/model/scoring.h"
#include "gemma_model.h"
#include "test_paths.h"

namespace deltaserve::model {
namespace {

constexpr int32_t kTokens = 1400;

class DeltaKvWindowModel : public ::testing::Test {
  protected:
    void SetUp() override {
        model_ = testing::gemma_model();
        if (model_ == nullptr) GTEST_SKIP() << testing::kGemmaAbsent;
        if (!testing::file_exists(testing::gemma_deltakv_profile()))
            GTEST_SKIP() << testing::gemma_deltakv_profile() << " is absent (deploy/profile.sh)";
    }
    static std::unique_ptr<InferenceContext> context(const std::string& policy, float keep) {
        ContextOptions co;
        co.n_ctx = 2048;
        co.n_batch = 128;
        co.n_threads = 2;
        co.kv.policy = policy;
        co.kv.keep = keep;
        if (policy == "deltakv") co.kv_profile = testing::gemma_deltakv_profile();
        auto ctx = InferenceContext::create(*model_, co);
        EXPECT_TRUE(ctx.ok()) << ctx.error().to_string();
        return ctx.ok() ? std::move(*ctx) : nullptr;
    }
    // A text no calibration read (GPL-3 is left out for evaluation), kTokens of it.
    static std::vector<int32_t> text() {
        std::ifstream in("/usr/share/common-licenses/GPL-3");
        std::stringstream s;
        s << in.rdbuf();
        auto ids = model_->tokenizer->encode(s.str(), true, false);
        EXPECT_TRUE(ids.ok());
        if (!ids.ok() || ids->size() < kTokens) return {};
        ids->resize(kTokens);
        return *ids;
    }
    // Perplexity of tokens [from, n) given the logits of every position.
    static double perplexity(const std::vector<float>& logits, const std::vector<int32_t>& t,
                             int32_t from) {
        const int32_t nv = model_->config.n_vocab;
        std::vector<double> lp;
        double nll = 0;
        for (int32_t i = from; i + 1 < static_cast<int32_t>(t.size()); ++i) {
            log_softmax(logits.data() + static_cast<size_t>(i) * nv, nv, lp);
            nll -= lp[t[i + 1]];
        }
        return std::exp(nll / static_cast<double>(t.size() - 1 - from));
    }
    static inline Model* model_ = nullptr;
};

TEST_F(DeltaKvWindowModel, PastTheWindowTheGlobalLayersCompressAndFollowFullKv) {
    const std::vector<int32_t> t = text();
    ASSERT_EQ(t.size(), static_cast<size_t>(kTokens));
    auto full = context("full", 1.0f);
    auto dkv = context("deltakv", 0.5f);
    ASSERT_TRUE(full && dkv);
    auto a = full->eval_all(t);
    auto b = dkv->eval_all(t);
    ASSERT_TRUE(a.ok() && b.ok()) << b.error().to_string();
    // Past the window only (the first 512 tokens see every token in every layer anyway).
    const double pf = perplexity(*a, t, 512), pd = perplexity(*b, t, 512);
    std::printf(
        "GPL-3, tokens 512..%d: perplexity %.4f full KV, %.4f deltakv (%+.2f%%); KV %zu vs "
        "%zu bytes\n",
        kTokens, pf, pd, 100.0 * (pd / pf - 1.0), dkv->kv_bytes(), full->kv_bytes());
    EXPECT_LT(pd / pf, 1.05);
    EXPECT_GT(pd / pf, 0.97);
    EXPECT_LT(dkv->kv_bytes(), full->kv_bytes());
    // Greedy decoding from the text's end: the same first tokens as full KV.
    std::vector<int32_t> ga, gb;
    const size_t nv = static_cast<size_t>(model_->config.n_vocab);
    std::vector<float> la(a->end() - static_cast<std::ptrdiff_t>(nv), a->end());
    std::vector<float> lb(b->end() - static_cast<std::ptrdiff_t>(nv), b->end());
    for (int i = 0; i < 8; ++i) {
        ga.push_back(static_cast<int32_t>(std::max_element(la.begin(), la.end()) - la.begin()));
        gb.push_back(static_cast<int32_t>(std::max_element(lb.begin(), lb.end()) - lb.begin()));
        auto x = full->eval({&ga.back(), 1});
        auto y = dkv->eval({&ga.back(), 1});  // both follow full KV's token
        ASSERT_TRUE(x.ok() && y.ok());
        la.assign(x->begin(), x->end());
        lb.assign(y->begin(), y->end());
    }
    int32_t same = 0;
    for (int i = 0; i < 8; ++i) same += ga[i] == gb[i];
    EXPECT_GE(same, 6) << "of 8 greedy tokens";
}

TEST_F(DeltaKvWindowModel, ShippedWholeContinuesExactly) {
    const std::vector<int32_t> t = text();
    ASSERT_EQ(t.size(), static_cast<size_t>(kTokens));
    auto a = context("deltakv", 0.5f), b = context("deltakv", 0.5f);
    ASSERT_TRUE(a && b);
    ASSERT_TRUE(a->eval(t).ok());
    auto state = a->export_kv_state();
    ASSERT_TRUE(state.ok()) << state.error().to_string();
    ASSERT_TRUE(b->import_kv_state(*state).ok());
    for (int32_t l = 0; l < model_->config.n_layers; ++l) {
        auto part = a->export_kv_layer(l);
        ASSERT_TRUE(part.ok()) << part.error().to_string();
        ASSERT_TRUE(b->import_kv_layer(l, *part).ok()) << l;
    }
    ASSERT_TRUE(b->import_kv_hints(a->export_kv_hints()).ok());
    const std::vector<int32_t> more = {t[10], t[11], t[12]};
    for (int32_t tok : more) {
        auto x = a->eval({&tok, 1});
        ASSERT_TRUE(x.ok());
        const std::vector<float> want(x->begin(), x->end());
        auto y = b->eval({&tok, 1});
        ASSERT_TRUE(y.ok());
        EXPECT_EQ(want, std::vector<float>(y->begin(), y->end()));
    }
}

}  // namespace
}  // namespace deltaserve::model
