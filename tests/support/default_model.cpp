#include "default_model.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "deltaserve/model/inference_context.h"
#include "test_paths.h"

namespace deltaserve::testing {

namespace {
constexpr const char* kLicense = "/usr/share/common-licenses/GPL-3";
}  // namespace

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

std::vector<int32_t> license_tokens(const model::Model& model, size_t n, size_t skip,
                                    bool add_bos) {
    std::ifstream in(kLicense);
    std::stringstream s;
    s << in.rdbuf();
    auto t = model.tokenizer->encode(s.str(), add_bos, false);
    EXPECT_TRUE(t.ok()) << t.error().to_string();
    if (!t.ok()) return {};
    const size_t b = std::min(skip, t->size()), e = std::min(t->size(), skip + n);
    return std::vector<int32_t>(t->begin() + static_cast<std::ptrdiff_t>(b),
                                t->begin() + static_cast<std::ptrdiff_t>(e));
}

std::vector<GreedyStep> greedy_steps(const model::Model& model, const std::vector<int32_t>& prompt,
                                     int n) {
    model::ContextOptions co;
    co.n_ctx = static_cast<int32_t>(prompt.size()) + n + 1;
    co.n_threads = 1;
    auto ctx = model::InferenceContext::create(model, co);
    EXPECT_TRUE(ctx.ok()) << ctx.error().to_string();
    if (!ctx.ok()) return {};
    std::vector<GreedyStep> steps;
    auto logits = (*ctx)->eval(prompt);
    for (int i = 0; i < n; ++i) {
        EXPECT_TRUE(logits.ok()) << logits.error().to_string();
        if (!logits.ok()) return {};
        GreedyStep s;
        s.logits.assign(logits->begin(), logits->end());
        s.token = static_cast<int32_t>(std::max_element(s.logits.begin(), s.logits.end()) -
                                       s.logits.begin());
        const int32_t one[] = {s.token};
        steps.push_back(std::move(s));
        if (i + 1 < n) logits = (*ctx)->eval(one);
    }
    return steps;
}

void DefaultModelTest::SetUp() {
    DS_REQUIRE_FILE(default_gguf_model(), "default model");
    DS_REQUIRE_FILE(default_deltakv_profile(), "default DeltaKV profile");
    DS_REQUIRE_FILE(std::string(kLicense), "GPL-3 text (base-files)");
}

}  // namespace deltaserve::testing
