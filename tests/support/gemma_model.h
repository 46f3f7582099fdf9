// Gemma 3 270M Q4_K_M (deploy/setup.sh fetches it into models/): the sliding-window model the
// window tests run, loaded once per test program. Header-only.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>

#include "deltaserve/model/model.h"
#include "test_paths.h"

namespace deltaserve::testing {

inline constexpr const char* kGemmaAbsent =
    "models/gemma-3-270m-q4_k_m.gguf is absent (deploy/setup.sh fetches it)";

// The model, or null when its file is absent (a file that does not load fails the test).
inline model::Model* gemma_model() {
    static const std::unique_ptr<model::Model> m = []() -> std::unique_ptr<model::Model> {
        const std::string path = models_dir() + "/gemma-3-270m-q4_k_m.gguf";
        if (!std::filesystem::exists(path)) return nullptr;
        model::LoadOptions lo;
        lo.show_progress = false;
        auto loaded = model::load_model(path, lo);
        EXPECT_TRUE(loaded.ok()) << loaded.error().to_string();
        return loaded.ok() ? std::move(*loaded) : nullptr;
    }();
    return m.get();
}

}  // namespace deltaserve::testing
