// Device side of the row and elementwise ops (elementwise.cu). Plain C++: the backend
// (cuda_backend.cpp) validates shapes and stages host arrays; every pointer here is device
// memory. Each launcher enqueues on `stream` and returns the launch error (execution errors
// surface at the next synchronizing call).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "deltaserve/kernels/dtype.h"

namespace deltaserve::kernels::cuda {

// out[r] = rms_norm(x[r], weight, eps) for n <= INT32_MAX rows of d; out may alias x.
cudaError_t launch_rms_norm_rows(const float* x, int64_t ldx, const float* weight, int64_t d,
                                 int64_t n, float eps, float* out, int64_t ldo,
                                 cudaStream_t stream);

// RoPE in place on the first n_heads heads of n <= INT32_MAX rows; theta_scale is
// base^(-2 / head_dim) from the host's powf, as kernels::rope computes it, then each pair's
// angle divided by its freq factor (head_dim / 2 of them; nullptr: none) and times
// freq_scale (RopeParams).
struct RopeRowsLaunch {
    float* x = nullptr;
    int64_t ldx = 0;
    int64_t n = 0;
    int n_heads = 0;
    int head_dim = 0;  // even, <= 1024
    const int32_t* positions = nullptr;
    float theta_scale = 0.0f;
    const float* freq_factors = nullptr;
    float freq_scale = 1.0f;
    bool interleaved = true;  // RopeStyle::kInterleaved, else kSplitHalf
};
cudaError_t launch_rope_rows(const RopeRowsLaunch& args, cudaStream_t stream);

// out[i] = gate[i] / (1 + exp(-gate[i])) * up[i].
cudaError_t launch_silu_mul(float* out, const float* gate, const float* up, int64_t n,
                            cudaStream_t stream);

// y[i] += x[i].
cudaError_t launch_add(float* y, const float* x, int64_t n, cudaStream_t stream);

// out[i] = gelu(gate[i]) * up[i] (tanh GELU, kernels::gelu_mul's expression); x[i] *= s.
cudaError_t launch_gelu_mul(float* out, const float* gate, const float* up, int64_t n,
                            cudaStream_t stream);
cudaError_t launch_scale(float* x, float s, int64_t n, cudaStream_t stream);

// out[i * cols, (i + 1) * cols) = row tokens[i] of a row-major table of a type
// weight_type_supported (matmul.h) takes; tokens in range.
cudaError_t launch_embed_rows(DType type, const void* table, size_t row_stride, int64_t cols,
                              const int32_t* tokens, int64_t n, float* out, cudaStream_t stream);

}  // namespace deltaserve::kernels::cuda
