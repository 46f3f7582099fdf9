// Device side of top_k (top_k.cu). Plain C++: the backend (cuda_backend.cpp) validates, and
// copies the results to the host; every pointer here is device memory.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace deltaserve::kernels::cuda {

// The device path takes k up to this; larger k costs a round per pick, and the backend sorts
// on the host instead.
constexpr int32_t kMaxDeviceTopK = 1024;

// For each of n_rows rows of n_vocab (<= INT32_MAX) logits: the k (in [1, min(n_vocab,
// kMaxDeviceTopK)]) largest, largest first, ties to the lower id, NaN ordered as -inf but
// reported as it is; into ids and values, n_rows * k each.
cudaError_t launch_top_k(const float* logits, int64_t n_vocab, int64_t n_rows, int32_t k,
                         int32_t* ids, float* values, cudaStream_t stream);

}  // namespace deltaserve::kernels::cuda
