#include "deltaserve/kernels/ops.h"

#include <immintrin.h>
#include <algorithm>

#include <cmath>

#include "simd_math.h"

namespace deltaserve::kernels {

void rms_norm(float* out, const float* x, const float* weight, int64_t n, float eps) {
    // The sum of squares in double, as ggml does: for wide rows it is also more exact.
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i] * x[i]);
    const float mean = static_cast<float>(ss / static_cast<double>(n));
    const float scale = 1.0f / std::sqrt(mean + eps);
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale * weight[i];
}

void rope(float* x, int n_heads, int head_dim, int64_t pos, const RopeParams& p) {
    const int half = head_dim / 2;
    const RopeStyle style = p.style;
    // The angles are the same for every head: compute them once.
    float cos_t[512];
    float sin_t[512];
    // theta_j = pos * base^(-2j/d), built by repeated multiplication in float as ggml's
    // rope cache does, so positions far into the context round the same way; then, as
    // ggml's rope_yarn without extrapolation, divided by the pair's factor and scaled.
    const float theta_scale = std::pow(p.base, -2.0f / static_cast<float>(head_dim));
    const float* ff = p.freq_factors.empty() ? nullptr : p.freq_factors.data();
    float theta = static_cast<float>(pos);
    for (int j = 0; j < half; ++j) {
        const float t = p.freq_scale * (ff != nullptr ? theta / ff[j] : theta);
        cos_t[j] = std::cos(t);
        sin_t[j] = std::sin(t);
        theta *= theta_scale;
    }
    for (int h = 0; h < n_heads; ++h) {
        float* v = x + static_cast<int64_t>(h) * head_dim;
        for (int j = 0; j < half; ++j) {
            const int i0 = style == RopeStyle::kInterleaved ? 2 * j : j;
            const int i1 = style == RopeStyle::kInterleaved ? 2 * j + 1 : j + half;
            const float a = v[i0];
            const float b = v[i1];
            v[i0] = a * cos_t[j] - b * sin_t[j];
            v[i1] = a * sin_t[j] + b * cos_t[j];
        }
    }
}

void silu_mul(float* out, const float* gate, const float* up, int64_t n) {
    int64_t i = 0;
    const __m256 one = _mm256_set1_ps(1.0f);
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), g));
        const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, e));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
    }
    for (; i < n; ++i) {
        const float g = gate[i];
        out[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
}

void gelu_mul(float* out, const float* gate, const float* up, int64_t n) {
    constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
    constexpr float kCoefA = 0.044715f;
    for (int64_t i = 0; i < n; ++i) {
        const float g = gate[i];
        out[i] = 0.5f * g * (1.0f + std::tanh(kSqrt2OverPi * g * (1.0f + kCoefA * g * g))) * up[i];
    }
}

void scale_inplace(float* x, float s, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void add_inplace(float* y, const float* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void softmax(float* x, int64_t n) {
    float mx = x[0];
    for (int64_t i = 1; i < n; ++i) mx = std::max(mx, x[i]);
    float sum = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
        x[i] = std::exp(x[i] - mx);
        sum += x[i];
    }
    const float inv = 1.0f / sum;
    for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace deltaserve::kernels
