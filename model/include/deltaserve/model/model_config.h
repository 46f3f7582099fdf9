// Hyperparameters of a Llama-family decoder, whatever file they came from.
#pragma once

#include <cstdint>
#include <string>

#include "deltaserve/kernels/ops.h"

namespace deltaserve::model {

struct ModelConfig {
    std::string arch = "llama";  // llama, qwen2, mistral (all the same graph here)
    std::string name;            // general.name or the file name
    int32_t n_vocab = 0;
    int32_t d_model = 0;
    int32_t n_layers = 0;
    int32_t n_heads = 0;
    int32_t n_kv_heads = 0;
    int32_t head_dim = 0;
    int32_t d_ff = 0;
    int32_t n_ctx_train = 2048;  // context length the model was trained for
    float rms_eps = 1e-5f;
    float rope_theta = 10000.0f;
    kernels::RopeStyle rope_style = kernels::RopeStyle::kInterleaved;
    bool tied_output = false;  // output head shares token_embd
    bool qkv_bias = false;     // Qwen2

    int32_t q_dim() const { return n_heads * head_dim; }
    int32_t kv_dim() const { return n_kv_heads * head_dim; }
};

}  // namespace deltaserve::model
