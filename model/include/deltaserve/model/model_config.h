// Hyperparameters of a Llama-family decoder, whatever file they came from.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "deltaserve/kernels/ops.h"

namespace deltaserve::model {

struct ModelConfig {
    std::string arch = "llama";  // llama, mistral, qwen2, qwen3
    std::string name;            // general.name or the file name
    int32_t n_vocab = 0;
    int32_t d_model = 0;
    int32_t n_layers = 0;
    int32_t n_heads = 0;
    int32_t n_kv_heads = 0;
    int32_t head_dim = 0;  // may differ from d_model / n_heads (Qwen3): q_dim() != d_model
    int32_t d_ff = 0;
    int32_t n_ctx_train = 2048;  // context length the model was trained for
    float rms_eps = 1e-5f;
    float rope_theta = 10000.0f;
    kernels::RopeStyle rope_style = kernels::RopeStyle::kInterleaved;
    // RoPE scaling (kernels::RopeParams): "none", "linear" (rope_freq_scale = 1 / factor) or
    // "llama3" (per-pair divisors of the angle: GGUF rope_freqs.weight, or made from HF
    // rope_scaling as llama.cpp's converter makes them). Anything else is refused at load.
    std::string rope_scaling = "none";
    float rope_freq_scale = 1.0f;
    std::vector<float> rope_freq_factors;  // head_dim / 2 values, or empty
    bool tied_output = false;              // output head shares token_embd
    bool qkv_bias = false;                 // Qwen2
    bool qk_norm = false;                  // Qwen3: RMSNorm of each head of q and k before RoPE

    int32_t q_dim() const { return n_heads * head_dim; }
    int32_t kv_dim() const { return n_kv_heads * head_dim; }
    // How the forward pass turns q and k (the factors point into this config).
    kernels::RopeParams rope() const {
        return {rope_theta, rope_style, rope_freq_scale, rope_freq_factors};
    }
};

}  // namespace deltaserve::model
