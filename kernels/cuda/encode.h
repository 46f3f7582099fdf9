// Device side of DeltaKV's compression op (encode.cu). Plain C++: encode_ops.cpp checks the
// arguments and runs the encoder's matmuls between these kernels; every pointer here is
// device memory.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace deltaserve::kernels::cuda {

// One block per token: the k nearest of its n_cand[i] candidate rows by L2 distance (nearest
// first, ties to the lower ordinal) into refs (0xFFFF past the candidates), their mean into
// rm. k is at most 16.
struct NearestLaunch {
    const float* x = nullptr;  // [n][d]
    int64_t n = 0;
    int d = 0;
    const float* ref_x = nullptr;  // [n_refs][d]
    const int32_t* n_cand = nullptr;
    int k = 0;
    uint16_t* refs = nullptr;  // [n][k]
    float* rm = nullptr;       // [n][d]
};
cudaError_t launch_nearest_refs(const NearestLaunch& a, cudaStream_t stream);

// z[i] = e[i] - e[n + i], rows of m floats: the encoder's output on [x; rm] made a residual.
cudaError_t launch_latent_residual(const float* e, int64_t n, int m, float* z, cudaStream_t stream);

// Each of n latents z (m floats) as stored, stride bytes apart: int4_pack's format (an fp16
// scale and minimum, then the codes, low nibble first), or m fp16 values.
cudaError_t launch_pack_latents(const float* z, int64_t n, int m, bool int4, uint8_t* out,
                                size_t stride, cudaStream_t stream);

}  // namespace deltaserve::kernels::cuda
