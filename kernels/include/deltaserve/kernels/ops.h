// Elementwise and row operations of the forward pass (CPU reference implementations).
// All pointers are fp32 unless stated; none of these allocate.
#pragma once

#include <cstdint>

namespace deltaserve::kernels {

// Which pairs of a head's elements RoPE rotates together.
enum class RopeStyle {
    kInterleaved,  // (x[2j], x[2j+1]): GGUF "llama" and llama2.c
    kSplitHalf,    // (x[j], x[j+d/2]): Hugging Face (NeoX / rotate_half)
};

// out[i] = x[i] / sqrt(mean(x^2) + eps) * weight[i], for one row of n. out may alias x.
void rms_norm(float* out, const float* x, const float* weight, int64_t n, float eps);

// Rotates n_heads heads of head_dim elements (contiguous) at position pos:
// theta_j = pos * base^(-2j / head_dim).
void rope(float* x, int n_heads, int head_dim, int64_t pos, float base, RopeStyle style);

// out[i] = silu(gate[i]) * up[i].
void silu_mul(float* out, const float* gate, const float* up, int64_t n);

// y[i] += x[i].
void add_inplace(float* y, const float* x, int64_t n);

// In-place softmax over n values; returns nothing, x sums to 1 afterwards.
void softmax(float* x, int64_t n);

}  // namespace deltaserve::kernels
