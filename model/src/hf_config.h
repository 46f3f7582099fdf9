// A Hugging Face config.json as a ModelConfig (private to model/).
#pragma once

#include <string>

#include "deltaserve/common/status.h"
#include "deltaserve/model/model_config.h"

namespace deltaserve::model {

// Reads dir/config.json. Options that change the graph in ways deltaserve does not compute
// (rope_scaling but default, linear and llama3; partial rotary; softcapping; experts;
// activations but silu; MLP biases) are kUnimplemented naming them, never ignored; bad
// values (NaN, zero heads, sizes that do not divide) are kInvalidArgument.
Result<ModelConfig> parse_hf_config(const std::string& dir);

// llama3 RoPE scaling's per-pair divisors, as llama.cpp's convert_hf_to_gguf.py makes them
// for rope_freqs.weight (in float, step for step): 1 for the fast pairs (wavelength under
// original_context / high_freq_factor), `factor` for the slow (over original_context /
// low_freq_factor), smoothly between. Callers check factor > 0, high > low > 0.
std::vector<float> llama3_rope_factors(float base, int head_dim, float factor,
                                       float low_freq_factor, float high_freq_factor,
                                       float original_context);

}  // namespace deltaserve::model
