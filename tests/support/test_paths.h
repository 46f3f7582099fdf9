// Where tests find data that is not in the repository.
#pragma once

#include <string>

namespace deltaserve::testing {

// The shared data folder (stories260K and its tokenizer): $DELTASERVE_SHARED_DIR, or the
// build's default (../shared beside the checkout).
std::string shared_dir();

// The models folder setup fills (the default GGUF): $DELTASERVE_MODELS_DIR or <repo>/models.
std::string models_dir();

// The repository's root (the checkout the tests were built from).
std::string source_dir();

// The repository's tests/data folder (committed golden data); $DELTASERVE_TEST_DATA_DIR where
// the tests run from a bundle (tests/gpu/bundle.sh).
std::string test_data_dir();

// The deltaserve binary built beside the tests.
std::string deltaserve_binary();
std::string deltactl_binary();

bool file_exists(const std::string& path);

// How much longer than a Release build's a time bound may be: $DELTASERVE_TEST_TIME_SCALE
// (the sanitizer runs set 5), else 1.
int time_scale();

// Paths of the two test models; empty string when absent.
std::string stories_model();
std::string stories_tokenizer();
std::string default_gguf_model();
// The default model's DeltaKV profile, which setup calibrates ($DELTASERVE_PROFILES_DIR or
// <repo>/profiles).
std::string default_deltakv_profile();
// Gemma 3 270M's, which deploy/profile.sh calibrates beside it.
std::string gemma_deltakv_profile();
// Where setup's profiles are: $DELTASERVE_PROFILES_DIR or <repo>/profiles.
std::string profiles_dir();
std::string default_trimkv_gates();
// Python with jax, gguf and openai (calibrate's end-to-end objective, the gateway's client
// tests): $DELTASERVE_TOOLS_PYTHON or the venv setup makes (<repo>/.venv-tools).
std::string tools_python();

}  // namespace deltaserve::testing

// Skips the current test with a clear message when a data file is missing.
#define DS_REQUIRE_FILE(path, what)                                                       \
    do {                                                                                  \
        if ((path).empty() || !::deltaserve::testing::file_exists(path))                  \
            GTEST_SKIP() << what << " not found (" << (path) << "); set "                 \
                         << "DELTASERVE_SHARED_DIR / DELTASERVE_MODELS_DIR or run setup"; \
    } while (0)
