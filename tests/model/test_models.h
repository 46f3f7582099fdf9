// The random-weight models of model/tools/make_test_models.py, written at test time into a
// temporary folder by the tools' Python (.venv-tools, deploy/setup.sh), and its float64
// oracle. Header-only: shared by the tests of tests/model that use them.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "test_paths.h"

namespace deltaserve::testing {

// Runs a shell command; its stdout, and its exit status in *status.
inline std::string run_command(const std::string& cmd, int* status) {
    std::string out;
    FILE* p = ::popen(cmd.c_str(), "r");
    if (p == nullptr) {
        *status = -1;
        return out;
    }
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
    *status = ::pclose(p);
    return out;
}

inline std::string test_models_script() {
    return source_dir() + "/model/tools/make_test_models.py";
}

// Writes the models (only the files to refuse with only_bad) into a new temporary folder and
// returns it; "" with the reason in *why when they could not be written.
inline std::string write_test_models(bool only_bad, std::string* why) {
    namespace fs = std::filesystem;
    const fs::path dir =
        fs::temp_directory_path() /
        ("deltaserve_test_models_" + std::to_string(::getpid()) + (only_bad ? "_bad" : ""));
    fs::remove_all(dir);
    int status = 0;
    const std::string log =
        run_command("'" + tools_python() + "' '" + test_models_script() +
                        "' write --tokenizer-from '" + default_gguf_model() + "' --out '" +
                        dir.string() + "'" + (only_bad ? " --only-bad" : "") + " 2>&1",
                    &status);
    if (status != 0) {
        *why = "make_test_models.py failed: " + log;
        return "";
    }
    return dir.string();
}

// The models of write_test_models(only_bad), written once per test program (at the first
// call) and removed as it ends; dir is "" with the reason in why when they could not be
// written.
struct TestModelsDir {
    std::string dir, why;
};
inline const TestModelsDir& test_models(bool only_bad) {
    struct Held {
        TestModelsDir d;
        explicit Held(bool bad) { d.dir = write_test_models(bad, &d.why); }
        ~Held() {
            std::error_code ec;
            if (!d.dir.empty()) std::filesystem::remove_all(d.dir, ec);
        }
    };
    if (only_bad) {
        static const Held bad(true);
        return bad.d;
    }
    static const Held all(false);
    return all.d;
}

// The oracle's float64 run of `model` on `tokens` with `greedy` steps after them (without
// the file's RoPE scaling with plain_rope): every token's logits into *logits (tokens x
// n_vocab), and {"n_vocab": n, "greedy": [ids], "gaps": [top-2 gap before each]}.
inline nlohmann::json oracle(const std::string& model, const std::vector<int32_t>& tokens,
                             int greedy, std::vector<double>* logits, bool plain_rope = false) {
    std::string ids;
    for (int32_t t : tokens) ids += (ids.empty() ? "" : ",") + std::to_string(t);
    const std::string out_path = (std::filesystem::temp_directory_path() /
                                  ("deltaserve_oracle_" + std::to_string(::getpid()) + ".f64"))
                                     .string();
    int status = 0;
    const std::string out =
        run_command("'" + tools_python() + "' '" + test_models_script() + "' oracle '" + model +
                        "' --tokens " + ids + " --greedy " + std::to_string(greedy) +
                        " --logits-out '" + out_path + "'" + (plain_rope ? " --plain-rope" : ""),
                    &status);
    EXPECT_EQ(status, 0) << "oracle of " << model;
    nlohmann::json j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
    logits->clear();
    if (FILE* f = std::fopen(out_path.c_str(), "rb")) {
        double x;
        while (std::fread(&x, sizeof(x), 1, f) == 1) logits->push_back(x);
        std::fclose(f);
    }
    std::filesystem::remove(out_path);
    return j;
}

}  // namespace deltaserve::testing

// Skips the test when the tools' Python or the default model (whose tokenizer the models
// take) is missing.
#define DS_REQUIRE_TEST_MODEL_TOOLS()                                                  \
    do {                                                                               \
        DS_REQUIRE_FILE(::deltaserve::testing::default_gguf_model(), "default model"); \
        DS_REQUIRE_FILE(::deltaserve::testing::tools_python(),                         \
                        "the tools' Python (deploy/setup.sh makes .venv-tools)");      \
    } while (0)
