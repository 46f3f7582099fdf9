// The RoPE angles of one position, shared by rms_norm_rope.cu and elementwise.cu.
#pragma once

namespace deltaserve::kernels::cuda {

// cos_t[j] and sin_t[j] for j < half, as kernels::rope (kernels/cpu/ops.cpp) makes them:
// theta_0 = float(pos), theta_{j+1} = theta_j * theta_scale rounded at every step (ggml's
// rope cache), so that far positions round the same way; pos * base^(-2j/d) in one step
// differs by up to 0.04 in sin at position 500000. Then theta_j / freq_factors[j] (none:
// nullptr) times freq_scale, each rounded, as RopeParams says. sin and cos in double,
// rounded once, agree with glibc's sinf/cosf almost always. The block's threads share the
// entries; the caller syncs before reading them.
__device__ inline void rope_table(float pos, float theta_scale, int half, float* cos_t,
                                  float* sin_t, const float* freq_factors = nullptr,
                                  float freq_scale = 1.0f) {
    for (int j = threadIdx.x; j < half; j += blockDim.x) {
        float theta = pos;
        for (int i = 0; i < j; ++i) theta = __fmul_rn(theta, theta_scale);
        if (freq_factors != nullptr) theta = __fdiv_rn(theta, freq_factors[j]);
        theta = __fmul_rn(freq_scale, theta);
        double s;
        double c;
        sincos(static_cast<double>(theta), &s, &c);
        cos_t[j] = static_cast<float>(c);
        sin_t[j] = static_cast<float>(s);
    }
}

}  // namespace deltaserve::kernels::cuda
