// The token loop shared by generate and chat: evaluate new tokens, sample, stream.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "deltaserve/common/status.h"
#include "deltaserve/model/inference_context.h"
#include "deltaserve/model/sampler.h"

namespace deltaserve::cli {

struct GenerationStats {
    std::vector<int32_t> generated;  // sampled ids, the end-of-generation token excluded
    bool stopped_at_eog = false;
    bool stopped_at_context = false;
    double prefill_seconds = 0;
    double decode_seconds = 0;
    int32_t n_prefilled = 0;
};

// Appends `input` to the context, then samples up to max_tokens tokens (< 0: until the
// context is full), calling on_token for each before evaluating it. Stops at an
// end-of-generation token, which is neither reported nor evaluated.
Result<GenerationStats> generate_tokens(model::InferenceContext& ctx, model::Sampler& sampler,
                                        std::span<const int32_t> input, int32_t max_tokens,
                                        const std::function<void(int32_t)>& on_token);

}  // namespace deltaserve::cli
