// SmolLM2-135M-Instruct Q4_1 against llama.cpp's outputs on the same file
// (tests/data/smollm2_golden.json, made by tests/golden/make_model_golden.py).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>

#include "deltaserve/kernels/backend.h"
#include "deltaserve/model/inference_context.h"
#include "deltaserve/model/sampler.h"
#include "test_paths.h"

namespace deltaserve::model {
namespace {

using nlohmann::json;

// Tolerances. This Q4_1 model amplifies rounding: llama.cpp's own flash-attention and
// plain paths differ by up to 1.14 logits on these prompts, and from an exact float64
// evaluation of the same weights by 0.94 and 1.47; even a change of summation order inside
// the softmax moves single logits by ~0.3. deltaserve must stay within that spread (it
// measures ~1.1 to llama.cpp and ~1.2 to float64); a wrong forward pass is off by far more.
constexpr double kMaxDiffToLlamaCpp = 1.5;
constexpr double kMaxDiffToFloat64 = 1.5;
// Greedy continuations must equal llama.cpp's token for token, except that they may part
// where llama.cpp's two best logits were closer than this (a near tie, well inside the
// difference between llama.cpp's own configurations).
constexpr double kNearTie = 0.3;
// With AttentionNumerics::kGgml the logits are llama.cpp's to the last bit on the AVX-512
// machine that made the golden data; the margin covers only the JSON's decimal rounding.
constexpr double kMaxDiffGgmlNumerics = 1e-4;

class SmolLM2Golden : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        const std::string path = testing::default_gguf_model();
        if (!testing::file_exists(path)) return;
        LoadOptions lo;
        lo.show_progress = false;
        auto m = load_model(path, lo);
        ASSERT_TRUE(m.ok()) << m.error().to_string();
        model_ = std::move(*m).release();
        std::ifstream in(testing::test_data_dir() + "/smollm2_golden.json");
        golden_ = new json(json::parse(in));
    }
    static void TearDownTestSuite() {
        delete model_;
        delete golden_;
    }
    void SetUp() override { DS_REQUIRE_FILE(testing::default_gguf_model(), "default model"); }

    static Model* model_;
    static json* golden_;
};
Model* SmolLM2Golden::model_ = nullptr;
json* SmolLM2Golden::golden_ = nullptr;

double max_logit_diff(std::span<const float> logits, const json& ref, const json& probe_ids) {
    double d = 0;
    for (const auto& pair : ref["top_k"]) {
        d = std::max(d, std::fabs(double(logits[pair[0].get<int>()]) - pair[1].get<double>()));
    }
    const auto& probes = ref["probe_logits"];
    for (size_t i = 0; i < probes.size(); ++i) {
        d = std::max(d,
                     std::fabs(double(logits[probe_ids[i].get<int>()]) - probes[i].get<double>()));
    }
    return d;
}

TEST_F(SmolLM2Golden, TokenIdsMatchLlamaCpp) {
    for (const auto& p : (*golden_)["prompts"]) {
        auto ids = model_->tokenizer->encode(p["text"].get<std::string>(), false,
                                             p["parse_special"].get<bool>());
        ASSERT_TRUE(ids.ok());
        EXPECT_EQ(*ids, p["tokens"].get<std::vector<int32_t>>()) << p["name"];
    }
}

struct GoldenRun {
    double worst = 0;      // max logit difference to llama.cpp
    double worst_f64 = 0;  // ... and to the float64 reference
    int identical = 0;     // 64-token greedy continuations equal to llama.cpp's
    int prompts = 0;
    std::vector<std::vector<int32_t>> continuations;  // each prompt's greedy tokens
    std::vector<std::vector<float>> gaps;             // the top-2 logit gap before each of them
};

double top2_gap(std::span<const float> l) {
    float a = -INFINITY, b = -INFINITY;
    for (float x : l) {
        if (x > a) {
            b = a;
            a = x;
        } else if (x > b) {
            b = x;
        }
    }
    return double(a) - double(b);
}

// Evaluates every golden prompt, then 64 greedy steps (not stopping at end-of-generation
// tokens, as the golden data). A continuation that parts from llama.cpp's must do so where
// llama.cpp's own two best logits were within near_tie.
GoldenRun run_golden(const Model& model, const json& g, AttentionNumerics numerics, double near_tie,
                     kernels::Backend* backend = nullptr) {
    ContextOptions co;
    co.backend = backend;
    co.n_ctx = 1024;
    co.n_threads = g["flags"]["n_threads"].get<int>();  // ggml's split path depends on it
    co.attention = numerics;
    auto ctx = InferenceContext::create(model, co);
    EXPECT_TRUE(ctx.ok());
    GoldenRun r;
    if (!ctx.ok()) return r;
    for (const auto& p : g["prompts"]) {
        (*ctx)->reset();
        const auto tokens = p["tokens"].get<std::vector<int32_t>>();
        auto logits = (*ctx)->eval(tokens);
        EXPECT_TRUE(logits.ok()) << logits.error().to_string();
        if (!logits.ok()) return r;
        const double d = max_logit_diff(*logits, p, g["probe_ids"]);
        const double d64 = max_logit_diff(*logits, p["variants"]["numpy_f64"], g["probe_ids"]);
        r.worst = std::max(r.worst, d);
        r.worst_f64 = std::max(r.worst_f64, d64);
        EXPECT_LT(d64, kMaxDiffToFloat64) << p["name"];
        std::vector<int32_t> out;
        std::vector<float> gaps;
        std::span<const float> l = *logits;
        for (int i = 0; i < g["gen_tokens"].get<int>(); ++i) {
            gaps.push_back(static_cast<float>(top2_gap(l)));
            out.push_back(greedy(l));
            auto next = (*ctx)->eval(std::span<const int32_t>(&out.back(), 1));
            EXPECT_TRUE(next.ok());
            if (!next.ok()) return r;
            l = *next;
        }
        const auto want = p["greedy"].get<std::vector<int32_t>>();
        size_t agree = 0;
        while (agree < out.size() && out[agree] == want[agree]) ++agree;
        r.identical += agree == want.size();
        if (agree < want.size()) {
            const double gap = p["greedy_top2_gap"][agree].get<double>();
            EXPECT_LT(gap, near_tie) << p["name"] << ": differs from llama.cpp at step " << agree
                                     << " where llama.cpp's choice was clear";
        }
        ++r.prompts;
        r.continuations.push_back(out);
        r.gaps.push_back(gaps);
        std::printf("%-28s logit diff %.4f  greedy agrees for %zu/%zu tokens\n",
                    p["name"].get<std::string>().c_str(), d, agree, want.size());
    }
    std::printf(
        "max logit diff: %.4f vs llama.cpp, %.4f vs the float64 reference; "
        "%d/%d continuations identical\n",
        r.worst, r.worst_f64, r.identical, r.prompts);
    return r;
}

// deltaserve's own attention (fp32 throughout): close to llama.cpp, parting only at near ties.
TEST_F(SmolLM2Golden, NextTokenLogitsAndGreedyContinuations) {
    const GoldenRun r = run_golden(*model_, *golden_, AttentionNumerics::kNative, kNearTie);
    EXPECT_LT(r.worst, kMaxDiffToLlamaCpp);
    EXPECT_EQ(r.prompts, 24);
}

// With llama.cpp's attention rounding everything else already rounds as llama.cpp does (the
// Q8_1 activations, the dot-product order, RMSNorm, RoPE, SiLU), so the logits are
// llama.cpp's and so are the continuations.
TEST_F(SmolLM2Golden, GgmlAttentionReproducesLlamaCpp) {
    const GoldenRun r = run_golden(*model_, *golden_, AttentionNumerics::kGgml, 0.0);
    EXPECT_LT(r.worst, kMaxDiffGgmlNumerics);
    EXPECT_EQ(r.identical, r.prompts);
    EXPECT_EQ(r.prompts, 24);
}

// The CUDA backend (issue 38): within llama.cpp's own spread of the float64 reference, and
// its greedy continuations the CPU backend's except where the CPU's two best logits were a
// near tie. Skips without a device.
TEST_F(SmolLM2Golden, CudaBackendAgreesWithTheCpu) {
    kernels::Backend* cuda = kernels::find_backend("cuda");
    if (cuda == nullptr || !cuda->available()) GTEST_SKIP() << "no CUDA backend or device here";
    const GoldenRun cpu = run_golden(*model_, *golden_, AttentionNumerics::kNative, kNearTie);
    const GoldenRun gpu = run_golden(*model_, *golden_, AttentionNumerics::kNative, kNearTie, cuda);
    ASSERT_EQ(gpu.prompts, 24);
    EXPECT_LT(gpu.worst, kMaxDiffToLlamaCpp);
    int same = 0;
    for (int p = 0; p < gpu.prompts; ++p) {
        const auto& a = cpu.continuations[p];
        const auto& b = gpu.continuations[p];
        size_t agree = 0;
        while (agree < a.size() && a[agree] == b[agree]) ++agree;
        same += agree == a.size();
        if (agree < a.size()) {
            std::printf("prompt %d parts from the CPU at step %zu: CPU top-2 gap %.4f, CUDA %.4f\n",
                        p, agree, cpu.gaps[p][agree], gpu.gaps[p][agree]);
            EXPECT_LT(cpu.gaps[p][agree], kNearTie) << "prompt " << p << ", step " << agree;
        }
    }
    std::printf(
        "CUDA: %d/%d continuations the CPU's; max logit diff %.4f vs llama.cpp "
        "(CPU %.4f), %.4f vs float64 (CPU %.4f)\n",
        same, gpu.prompts, gpu.worst, cpu.worst, gpu.worst_f64, cpu.worst_f64);
}

}  // namespace
}  // namespace deltaserve::model
