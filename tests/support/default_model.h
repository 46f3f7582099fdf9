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
