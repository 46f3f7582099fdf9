#include "test_paths.h"

#include <cstdlib>
#include <filesystem>

namespace deltaserve::testing {

namespace {
std::string env_or(const char* name, const std::string& fallback) {
    const char* v = std::getenv(name);
    return v && *v ? std::string(v) : fallback;
}
}  // namespace

std::string shared_dir() { return env_or("DELTASERVE_SHARED_DIR", DELTASERVE_DEFAULT_SHARED_DIR); }
std::string models_dir() {
    return env_or("DELTASERVE_MODELS_DIR", std::string(DELTASERVE_SOURCE_DIR) + "/models");
}
int time_scale() {
    const int s = std::atoi(env_or("DELTASERVE_TEST_TIME_SCALE", "1").c_str());
    return s > 0 ? s : 1;
}
std::string test_data_dir() {
    return env_or("DELTASERVE_TEST_DATA_DIR", std::string(DELTASERVE_SOURCE_DIR) + "/tests/data");
}
std::string source_dir() { return DELTASERVE_SOURCE_DIR; }
std::string deltaserve_binary() { return DELTASERVE_BINARY_PATH; }
std::string deltactl_binary() { return DELTASERVE_DELTACTL_PATH; }

bool file_exists(const std::string& path) { return std::filesystem::exists(path); }

std::string stories_model() { return shared_dir() + "/models/stories260K.bin"; }
std::string stories_tokenizer() { return shared_dir() + "/models/tok512.bin"; }
std::string default_gguf_model() { return models_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf"; }
std::string profiles_dir() {
    return env_or("DELTASERVE_PROFILES_DIR", std::string(DELTASERVE_SOURCE_DIR) + "/profiles");
}
std::string default_deltakv_profile() {
    return profiles_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf/deltakv.json";
}
std::string default_trimkv_gates() {
    return profiles_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf/trimkv.json";
}
std::string gemma_deltakv_profile() {
    return profiles_dir() + "/gemma-3-270m-q4_k_m.gguf/deltakv.json";
}

std::string tools_python() {
    return env_or("DELTASERVE_TOOLS_PYTHON",
                  std::string(DELTASERVE_SOURCE_DIR) + "/.venv-tools/bin/python");
}

}  // namespace deltaserve::testing
