// The default model (SmolLM2-135M-Instruct Q4_1), loaded once per test suite.
#pragma once

#include "deltaserve/model/model.h"

namespace deltaserve::testing {

// The loaded model (the caller owns it), or nullptr when the file is absent (SetUp skips
// with DS_REQUIRE_FILE). A file that does not load fails the test.
model::Model* load_default_model();

}  // namespace deltaserve::testing
