// Elementwise and row operations of the forward pass (CPU reference implementations).
// All pointers are fp32 unless stated; none of these allocate.
#pragma once

#include <cstdint>
#include <span>

namespace deltaserve::kernels {

// Which pairs of a head's elements RoPE rotates together.
enum class RopeStyle {
    kInterleaved,  // (x[2j], x[2j+1]): GGUF "llama" and llama2.c
    kSplitHalf,    // (x[j], x[j+d/2]): Hugging Face (NeoX / rotate_half)
};

// out[i] = x[i] / sqrt(mean(x^2) + eps) * weight[i], for one row of n. out may alias x.
void rms_norm(float* out, const float* x, const float* weight, int64_t n, float eps);

// How RoPE turns a head's pair j at position pos, as ggml_rope_ext computes it:
// theta_j = freq_scale * (pos * base^(-2j / head_dim) / freq_factors[j]), pos * base^(-2j/d)
// built by repeated multiplication in float (ggml's rope cache). The defaults are plain RoPE,
// to the bit: x / 1 and 1 * x are exact.
struct RopeParams {
    float base = 10000.0f;                      // Default: 10000 (> 0)
    RopeStyle style = RopeStyle::kInterleaved;  // Default: kInterleaved
    float freq_scale = 1.0f;  // linear scaling, 1 / factor. Default: 1 (finite, > 0)
    // head_dim / 2 divisors of theta_j (llama3 scaling, GGUF rope_freqs.weight), host memory
    // the caller keeps alive for the call. Default: empty (none).
    std::span<const float> freq_factors;

    // Plain RoPE: no scaling (DeltaKV's angle tables compute only that).
    bool plain() const { return freq_scale == 1.0f && freq_factors.empty(); }
};

// Rotates n_heads heads of head_dim elements (contiguous) at position pos.
// p.freq_factors, when given, holds head_dim / 2 values.
void rope(float* x, int n_heads, int head_dim, int64_t pos, const RopeParams& p);
// Plain RoPE: theta_j = pos * base^(-2j / head_dim).
inline void rope(float* x, int n_heads, int head_dim, int64_t pos, float base, RopeStyle style) {
    rope(x, n_heads, head_dim, pos, RopeParams{base, style});
}

// out[i] = silu(gate[i]) * up[i].
void silu_mul(float* out, const float* gate, const float* up, int64_t n);

// GeGLU with the tanh GELU (Gemma): out[i] = gelu(gate[i]) * up[i], gelu(g) =
// 0.5 g (1 + tanh(sqrt(2 / pi) g (1 + 0.044715 g^2))) in float, ggml_gelu_f32's expression.
void gelu_mul(float* out, const float* gate, const float* up, int64_t n);

// x[i] *= s.
void scale_inplace(float* x, float s, int64_t n);

// y[i] += x[i].
void add_inplace(float* y, const float* x, int64_t n);

// In-place softmax over n values; returns nothing, x sums to 1 afterwards.
void softmax(float* x, int64_t n);

}  // namespace deltaserve::kernels
