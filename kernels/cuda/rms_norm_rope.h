// Device side of the fused RMSNorm + RoPE (rms_norm_rope.cu). Plain C++: the backend
// (cuda_backend.cpp) validates, stages host memory and converts errors.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace deltaserve::kernels::cuda {

// Device pointers and shape; the caller has validated the shape (RmsNormRopeParams).
struct RmsNormRopeLaunch {
    const float* x = nullptr;            // n_rows * d_model
    const float* weight = nullptr;       // d_model
    const int64_t* positions = nullptr;  // n_rows
    float* out = nullptr;                // n_rows * d_model; may alias x
    int64_t n_rows = 0;                  // <= INT32_MAX (one block per row)
    int64_t d_model = 0;
    int n_heads = 0;
    int head_dim = 0;
    float eps = 0.0f;
    float theta_scale = 0.0f;  // base^(-2 / head_dim), from the host's powf as kernels::rope
    bool interleaved = true;   // RopeStyle::kInterleaved, else kSplitHalf
};

// Enqueues the kernel on stream; returns the launch error (execution errors surface at
// the next synchronizing call).
cudaError_t launch_rms_norm_rope(const RmsNormRopeLaunch& args, cudaStream_t stream);

}  // namespace deltaserve::kernels::cuda
