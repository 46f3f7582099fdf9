// Batching sessions does not change their numbers: a decode worker puts whichever sessions
// are running into one forward pass (model::eval_batch), and a greedy answer must be the
// same under any load. Bit-identical logits, on the default model (quantized weights).
#include <gtest/gtest.h>

#include "default_model.h"
#include "deltaserve/kernels/repack.h"
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

// The matmul kernels read weights repacked at load (interleaved rows); a model loaded
// without repacking gives the same logits to the bit, alone and batched (a batch's
// one-token steps attend together, one sequence per thread), with either attention's
// numerics.
class Repacked : public testing::DefaultModelTest,
                 public ::testing::WithParamInterface<AttentionNumerics> {};

TEST_P(Repacked, SameLogitsAsRowMajorWeights) {
    LoadOptions lo;
    lo.show_progress = false;
    lo.repack = false;
    auto rows = load_model(testing::default_gguf_model(), lo);
    ASSERT_TRUE(rows.ok()) << rows.error().to_string();
    const ModelWeights& packed = model_->weights;
    EXPECT_EQ(packed.layers[0].w_gate.interleave, kernels::kRowInterleave);
    EXPECT_EQ((*rows)->weights.layers[0].w_gate.interleave, 1);
    if (model_->config.tied_output) EXPECT_EQ(packed.output.data, packed.token_embd.data);

    auto threads = std::make_shared<ThreadPool>(2);
    auto contexts = [&](const Model& m) {
        std::vector<std::unique_ptr<InferenceContext>> out;
        for (int s = 0; s < 3; ++s) {
            ContextOptions co;
            co.n_ctx = 1024;
            co.threads = threads;
            co.attention = GetParam();
            auto c = InferenceContext::create(m, co);
            EXPECT_TRUE(c.ok()) << c.error().to_string();
            if (c.ok()) out.push_back(std::move(*c));
        }
        return out;
    };
    auto a = contexts(*model_), b = contexts(**rows);
    ASSERT_EQ(a.size(), 3u);
    ASSERT_EQ(b.size(), 3u);
    std::vector<int32_t> next(3);
    for (int s = 0; s < 3; ++s) {
        const auto prompt = text_tokens(40 + 70 * s, 50 * s);
        auto la = a[s]->eval(prompt);
        ASSERT_TRUE(la.ok());
        const std::vector<float> first(la->begin(), la->end());
        auto lb = b[s]->eval(prompt);
        ASSERT_TRUE(lb.ok());
        ASSERT_EQ(first, std::vector<float>(lb->begin(), lb->end())) << "prompt " << s;
        next[s] = greedy(first);
    }
    std::vector<InferenceContext*> pa, pb;
    for (int s = 0; s < 3; ++s) {
        pa.push_back(a[s].get());
        pb.push_back(b[s].get());
    }
    for (int step = 0; step < 4; ++step) {
        std::vector<std::span<const int32_t>> in;
        for (int s = 0; s < 3; ++s) in.emplace_back(&next[s], 1);
        std::vector<float> batched, alone;
        ASSERT_TRUE(eval_batch(pa, in, batched).ok());
        const size_t v = static_cast<size_t>(model_->config.n_vocab);
        for (int s = 0; s < 3; ++s) {
            auto own = pb[s]->eval(in[s]);
            ASSERT_TRUE(own.ok());
            alone.insert(alone.end(), own->begin(), own->end());
        }
        ASSERT_EQ(batched, alone) << "step " << step;
        for (int s = 0; s < 3; ++s) {
            next[s] = greedy(std::span<const float>(batched).subspan(s * v, v));
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Numerics, Repacked,
                         ::testing::Values(AttentionNumerics::kNative, AttentionNumerics::kGgml),
                         [](const auto& info) {
                             return std::string(info.param == AttentionNumerics::kGgml ? "ggml"
                                                                                       : "native");
                         });

}  // namespace
}  // namespace deltaserve::model

namespace deltaserve::model {
namespace {

// A worker's BatchRunner gives the logits eval_batch gives (and each context alone), and
// takes only contexts of its own model, pool and numerics.
class Runner : public testing::DefaultModelTest {};

TEST_F(Runner, SameLogitsAsEvalBatchAndOnlyItsOwnContexts) {
    auto threads = std::make_shared<ThreadPool>(2);
    auto make = [&](std::shared_ptr<ThreadPool> pool) {
        ContextOptions co;
        co.n_ctx = 512;
        co.threads = std::move(pool);
        auto c = InferenceContext::create(*model_, co);
        EXPECT_TRUE(c.ok()) << c.error().to_string();
        return c.ok() ? std::move(*c) : nullptr;
    };
    std::unique_ptr<InferenceContext> a[2] = {make(threads), make(threads)};
    std::unique_ptr<InferenceContext> b[2] = {make(threads), make(threads)};
    std::vector<std::vector<int32_t>> prompts = {text_tokens(30), text_tokens(50, 200)};
    BatchRunner runner(*model_, threads, AttentionNumerics::kNative);
    std::vector<float> by_runner, by_first;
    InferenceContext* pa[] = {a[0].get(), a[1].get()};
    InferenceContext* pb[] = {b[0].get(), b[1].get()};
    std::vector<std::span<const int32_t>> in(prompts.begin(), prompts.end());
    ASSERT_TRUE(runner.run(pa, in, by_runner).ok());
    ASSERT_TRUE(eval_batch(pb, in, by_first).ok());
    EXPECT_EQ(by_runner, by_first);
    EXPECT_EQ(a[1]->n_past(), 50);

    auto other = make(std::make_shared<ThreadPool>(1));
    InferenceContext* po[] = {other.get()};
    std::vector<std::span<const int32_t>> one = {in[0]};
    EXPECT_EQ(runner.run(po, one, by_runner).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(other->n_past(), 0);
    BatchRunner ggml(*model_, threads, AttentionNumerics::kGgml);
    EXPECT_EQ(ggml.run(pa, in, by_runner).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(a[0]->n_past(), 30);
}

}  // namespace
}  // namespace deltaserve::model
