// Batching sessions does not change their numbers: a decode worker puts whichever sessions
// are running into one forward pass (model::eval_batch), and a greedy answer must be the
// same under any load. Bit-identical logits, on the default model (quantized weights).
#include <gtest/gtest.h>

#include "default_model.h"
#include "deltaserve/model/inference_context.h"
#include "deltaserve/model/sampler.h"
#include "test_paths.h"

namespace deltaserve::model {
namespace {

class EvalBatch : public testing::DefaultModelTest,
                  public ::testing::WithParamInterface<const char*> {
  protected:
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
    std::shared_ptr<ThreadPool> threads_ = std::make_shared<ThreadPool>(2);
};

TEST_P(EvalBatch, SessionsInOnePassGiveTheirAloneLogits) {
    // Four sessions of different lengths (DeltaKV compresses the longer ones), each twice:
    // one copy runs batched, the other alone.
    constexpr int kSessions = 4;
    std::vector<std::unique_ptr<InferenceContext>> batched, alone;
    std::vector<int32_t> next(kSessions);
    for (int s = 0; s < kSessions; ++s) {
        const auto prompt = text_tokens(150 + 60 * s, 100 * s);
        for (auto* set : {&batched, &alone}) {
            set->push_back(context());
            ASSERT_TRUE(set->back());
            ASSERT_TRUE(set->back()->eval(prompt).ok());
        }
        next[s] = prompt.back();
    }
    std::vector<InferenceContext*> ptrs;
    for (auto& c : batched) ptrs.push_back(c.get());
    for (int step = 0; step < 5; ++step) {
        // A prompt chunk joins the decoding tokens at step 2, as chunked prefill does.
        std::vector<std::vector<int32_t>> input(kSessions);
        for (int s = 0; s < kSessions; ++s) {
            input[s] = step == 2 && s == 1 ? text_tokens(40, 900) : std::vector<int32_t>{next[s]};
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
