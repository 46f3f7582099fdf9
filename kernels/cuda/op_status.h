// The forward ops' shared checks (forward_ops.cpp, attention_ops.cpp). Private to
// kernels/cuda.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <limits>
#include <string>

#include "cuda_status.h"
#include "deltaserve/common/status.h"

namespace deltaserve::kernels::cuda {

// Rows, tokens and (query, head) pairs go to gridDim.x, or are its multiple.
inline constexpr int64_t kMaxRows = std::numeric_limits<int32_t>::max();

// kInvalidArgument naming the op.
inline Status invalid(const char* op, const std::string& what) {
    return invalid_argument(std::string("cuda ") + op + ": " + what);
}

// A launch's error as a Status naming the op.
inline Status launched(cudaError_t err, const char* op) {
    return from_cuda(err, std::string("cuda ") + op);
}

}  // namespace deltaserve::kernels::cuda
