// Device side of the KV caches' row ops (kv_rows.cu): Backend::store_rows and copy_rows.
// Plain C++; every pointer is device memory, the slot lists included (forward_ops.cpp
// checks and stages them). Each launcher enqueues on `stream` and returns the launch error.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace deltaserve::kernels::cuda {

// Row i of src (n <= INT32_MAX rows of `width` floats, ld apart) into row slots[i] of dst
// (row_stride bytes apart), as fp16 (round to nearest even) when `f16`, else fp32.
cudaError_t launch_store_rows(bool f16, int64_t width, const float* src, int64_t ld, int64_t n,
                              uint8_t* dst, size_t row_stride, const int32_t* slots,
                              cudaStream_t stream);

// Row src_rows[i] of src to row dst_rows[i] of dst, row_bytes each, n <= INT32_MAX rows; a
// null list stands for 0 .. n - 1.
cudaError_t launch_copy_rows(uint8_t* dst, size_t dst_stride, const int32_t* dst_rows,
                             const uint8_t* src, size_t src_stride, const int32_t* src_rows,
                             size_t row_bytes, int64_t n, cudaStream_t stream);

}  // namespace deltaserve::kernels::cuda
