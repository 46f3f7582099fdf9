// Batching sessions does not change their numbers: a decode worker puts whichever sessions
// are running into one forward pass (model::eval_batch), and a greedy answer must be the
// same under any load. Bit-identical logits, on the default model (quantized weights).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "default_model.h"
#include "deltaserve/model/inference_context.h"
#include "deltaserve/model/sampler.h"
#include "test_paths.h"

namespace deltaserve::model {
namespace {

class EvalBatch : public ::testing::TestWithParam<const char*> {
  protected:
    static void SetUpTestSuite() { model_ = testing::load_default_model(); }
    static void TearDownTestSuite() { delete model_; }
    void SetUp() override {
        DS_REQUIRE_FILE(testing::default_gguf_model(), "default model");
        DS_REQUIRE_FILE(testing::default_deltakv_profile(), "default DeltaKV profile");
        DS_REQUIRE_FILE(std::string("/usr/share/common-licenses/GPL-3"), "GPL-3 text");
    }
    std::unique_ptr<InferenceContext> context() {
        ContextOptions co;
        co.n_ctx = 1024;
        co.kv.policy = GetParam();
        co.kv.keep = co.kv.policy == "full" ? 1.0f : 0.3f;
        co.kv_profile = testing::default_deltakv_profile();
        co.threads = threads_;
        auto c = InferenceContext::create(*model_, co);
        EXPECT_TRUE(c.ok()) << c.error().to_string();
        return c.ok() ? std::move(*c) : nullptr;
    }
    static std::vector<int32_t> text_tokens(size_t skip, size_t n) {
        std::ifstream in("/usr/share/common-licenses/GPL-3");
        std::stringstream s;
        s << in.rdbuf();
        auto t = model_->tokenizer->encode(s.str(), false, false);
        EXPECT_TRUE(t.ok());
        return std::vector<int32_t>(t->begin() + static_cast<std::ptrdiff_t>(skip),
                                    t->begin() + static_cast<std::ptrdiff_t>(skip + n));
    }
    std::shared_ptr<ThreadPool> threads_ = std::make_shared<ThreadPool>(2);
    static Model* model_;
};
Model* EvalBatch::model_ = nullptr;

TEST_P(EvalBatch, SessionsInOnePassGiveTheirAloneLogits) {
    // Five sessions of different lengths (DeltaKV compresses the longer ones), each twice:
    // one copy runs batched, the other alone.
    constexpr int kSessions = 5;
    std::vector<std::unique_ptr<InferenceContext>> batched, alone;
    std::vector<int32_t> next(kSessions);
    for (int s = 0; s < kSessions; ++s) {
        const auto prompt = text_tokens(100 * s, 150 + 70 * s);
        for (auto* set : {&batched, &alone}) {
            set->push_back(context());
            ASSERT_TRUE(set->back());
            ASSERT_TRUE(set->back()->eval(prompt).ok());
        }
        next[s] = prompt.back();
    }
    std::vector<InferenceContext*> ptrs;
    for (auto& c : batched) ptrs.push_back(c.get());
    for (int step = 0; step < 6; ++step) {
        // A prompt chunk joins the decoding tokens at step 3, as chunked prefill does.
        std::vector<std::vector<int32_t>> input(kSessions);
        for (int s = 0; s < kSessions; ++s) {
            input[s] = step == 3 && s == 1 ? text_tokens(900, 40) : std::vector<int32_t>{next[s]};
        }
        std::vector<std::span<const int32_t>> spans(input.begin(), input.end());
        std::vector<float> logits;
        ASSERT_TRUE(eval_batch(ptrs, spans, logits).ok());
        const size_t v = static_cast<size_t>(model_->config.n_vocab);
        ASSERT_EQ(logits.size(), kSessions * v);
        for (int s = 0; s < kSessions; ++s) {
            auto own = alone[s]->eval(input[s]);
            ASSERT_TRUE(own.ok());
            const std::vector<float> a(own->begin(), own->end());
            const std::vector<float> b(logits.begin() + s * v, logits.begin() + (s + 1) * v);
            ASSERT_EQ(a, b) << "session " << s << " step " << step;
            next[s] = greedy(a);
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Policies, EvalBatch, ::testing::Values("full", "deltakv"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace deltaserve::model
