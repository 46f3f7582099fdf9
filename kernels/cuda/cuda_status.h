// The one place cudaError_t becomes a Status (cuda_status.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <string_view>

#include "deltaserve/common/status.h"

namespace deltaserve::kernels::cuda {

// OK for cudaSuccess; otherwise "<what>: <cudaErrorName> (<code>): <description>" with
// kResourceExhausted (out of memory), kUnavailable (no device or driver), kInvalidArgument
// (invalid value) or kInternal (anything else). Clears the thread's last CUDA error.
Status from_cuda(cudaError_t err, std::string_view what);

}  // namespace deltaserve::kernels::cuda
