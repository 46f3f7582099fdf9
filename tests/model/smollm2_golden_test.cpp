// SmolLM2-135M-Instruct Q4_1 against llama.cpp's outputs on the same file
// (tests/data/smollm2_golden.json, made by tests/golden/make_model_golden.py).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>

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
        d = std::max(d, std::fabs(double(logits[probe_ids[i].get<int>()]) - probes[i].get<double>()));
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

TEST_F(SmolLM2Golden, NextTokenLogitsAndGreedyContinuations) {
    ContextOptions co;
    co.n_ctx = 1024;
    auto ctx = InferenceContext::create(*model_, co);
    ASSERT_TRUE(ctx.ok());
    const json& g = *golden_;
    int identical = 0, n = 0;
    double worst = 0, worst_f64 = 0;
    for (const auto& p : g["prompts"]) {
        (*ctx)->reset();
        const auto tokens = p["tokens"].get<std::vector<int32_t>>();
        auto logits = (*ctx)->eval(tokens);
        ASSERT_TRUE(logits.ok()) << logits.error().to_string();
        const double d = max_logit_diff(*logits, p, g["probe_ids"]);
        worst = std::max(worst, d);
        const double d64 = max_logit_diff(*logits, p["variants"]["numpy_f64"], g["probe_ids"]);
        worst_f64 = std::max(worst_f64, d64);
        EXPECT_LT(d64, kMaxDiffToFloat64) << p["name"];
        EXPECT_LT(d, kMaxDiffToLlamaCpp) << p["name"];
        // 64 greedy steps, not stopping at end-of-generation tokens (as the golden data).
        std::vector<int32_t> out;
        std::span<const float> l = *logits;
        for (int i = 0; i < g["gen_tokens"].get<int>(); ++i) {
            out.push_back(greedy(l));
            auto next = (*ctx)->eval(std::span<const int32_t>(&out.back(), 1));
            ASSERT_TRUE(next.ok());
            l = *next;
        }
        const auto want = p["greedy"].get<std::vector<int32_t>>();
        size_t agree = 0;
        while (agree < out.size() && out[agree] == want[agree]) ++agree;
        identical += agree == want.size();
        if (agree < want.size()) {
            const double gap = p["greedy_top2_gap"][agree].get<double>();
            EXPECT_LT(gap, kNearTie) << p["name"] << ": differs from llama.cpp at step " << agree
                                     << " where llama.cpp's choice was clear";
        }
        ++n;
        std::printf("%-28s logit diff %.4f  greedy agrees for %zu/%zu tokens\n",
                    p["name"].get<std::string>().c_str(), d, agree, want.size());
    }
    std::printf("max logit diff: %.4f vs llama.cpp, %.4f vs the float64 reference; "
                "%d/%d continuations identical\n", worst, worst_f64, identical, n);
}

}  // namespace
}  // namespace deltaserve::model
