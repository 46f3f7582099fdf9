// The default model (SmolLM2-135M-Instruct Q4_1), loaded once per test suite.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "deltaserve/model/model.h"

namespace deltaserve::testing {

// The loaded model (the caller owns it), or nullptr when the file is absent (SetUp skips
// with DS_REQUIRE_FILE). A file that does not load fails the test.
model::Model* load_default_model();

// Tokens [skip, skip + n) of the GPL-3 text (Debian's base-files), fewer where it ends.
std::vector<int32_t> license_tokens(const model::Model& model, size_t n, size_t skip = 0,
                                    bool add_bos = false);

// The model's own greedy continuation of prompt (a fresh one-thread context, full KV): n
// steps, each the logits after the tokens so far and the token they pick (the lowest id of
// a tie). Empty (a test failure added) when an evaluation fails. What served answers are
// checked against.
struct GreedyStep {
    std::vector<float> logits;
    int32_t token = -1;
};
std::vector<GreedyStep> greedy_steps(const model::Model& model, const std::vector<int32_t>& prompt,
                                     int n);

// A suite on the default model with its DeltaKV profile, fed the GPL-3 text: the model is
// loaded once (model_); each test skips with a message when one of them is absent.
class DefaultModelTest : public ::testing::Test {
  protected:
    static void SetUpTestSuite() { model_ = load_default_model(); }
    static void TearDownTestSuite() {
        delete model_;
        model_ = nullptr;
    }
    void SetUp() override;
    static std::vector<int32_t> text_tokens(size_t n, size_t skip = 0, bool add_bos = false) {
        return license_tokens(*model_, n, skip, add_bos);
    }
    static inline model::Model* model_ = nullptr;
};

}  // namespace deltaserve::testing
