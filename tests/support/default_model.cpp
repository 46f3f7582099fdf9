#include "default_model.h"

#include <gtest/gtest.h>

#include "test_paths.h"

namespace deltaserve::testing {

model::Model* load_default_model() {
    if (!file_exists(default_gguf_model())) return nullptr;
    model::LoadOptions lo;
    lo.show_progress = false;
    auto m = model::load_model(default_gguf_model(), lo);
    if (!m.ok()) {
        ADD_FAILURE() << m.error().to_string();
        return nullptr;
    }
    return std::move(*m).release();
}

}  // namespace deltaserve::testing
