// Hyperparameters of a Llama-family decoder, whatever file they came from.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "deltaserve/kernels/ops.h"

namespace deltaserve::model {

struct ModelConfig {
    std::string arch = "llama";  // llama, mistral, qwen2, qwen3, gemma3
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
    bool qk_norm = false;  // Qwen3, Gemma 3: RMSNorm of each head of q and k before RoPE
    // Gemma 3: the embedding times sqrt(d_model), GeGLU (tanh GELU) for SwiGLU, RMSNorms of
    // the attention's and the FFN's outputs before their residual adds, a query scale of its
    // own, and local layers of sliding-window attention (local_layer[i]) with RoPE of their
    // own (rope_theta_local, unscaled) beside the global ones: layer i is local when
    // local_layer[i] says so, else (without a list) when local_pattern > 0 and (i + 1) is
    // not a multiple of it (Gemma 3: 6). A cache whose policy declares windows
    // (kvstore::KvPolicyInfo::windows) keeps a local layer's window only; any other is capped
    // at `sliding_window` tokens, where full attention equals the window's.
    float embedding_scale = 1.0f;  // 1: none
    bool gelu_ffn = false;
    bool post_norms = false;
    float attention_scale = 0.0f;   // 0: 1 / sqrt(head_dim)
    int32_t sliding_window = 0;     // 0: none
    std::vector<bool> local_layer;  // n_layers values (HF layer_types), or empty
    int32_t local_pattern = 0;      // 0: no pattern
    float rope_theta_local = 10000.0f;

    int32_t q_dim() const { return n_heads * head_dim; }
    int32_t kv_dim() const { return n_kv_heads * head_dim; }
    // How the forward pass turns q and k of the global layers (the factors point into this
    // config), and of `layer`.
    kernels::RopeParams rope() const {
        return {rope_theta, rope_style, rope_freq_scale, rope_freq_factors};
    }
    bool is_local(int32_t layer) const {
        if (!local_layer.empty()) {
            return static_cast<size_t>(layer) < local_layer.size() && local_layer[layer];
        }
        return local_pattern > 0 && (layer + 1) % local_pattern != 0;
    }
    // A local layer that attends a sliding window (a local layer without one attends fully).
    bool is_window_layer(int32_t layer) const { return sliding_window > 0 && is_local(layer); }
    kernels::RopeParams rope(int32_t layer) const {
        if (is_local(layer)) return {rope_theta_local, rope_style, 1.0f, {}};
        return rope();
    }
    // One RoPE for every layer, and plain (what DeltaKV's angle tables compute).
    bool plain_rope_everywhere() const {
        for (int32_t i = 0; i < n_layers; ++i) {
            if (is_local(i) && rope_theta_local != rope_theta) return false;
        }
        return rope().plain();
    }
    float attention_scale_or_default() const {
        return attention_scale > 0.0f ? attention_scale
                                      : 1.0f / std::sqrt(static_cast<float>(head_dim));
    }
};

}  // namespace deltaserve::model
