// The KV caches' row ops: new rows stored at their slots, rows gathered and scattered.
#include <cuda_fp16.h>

#include "kv_rows.h"

namespace deltaserve::kernels::cuda {
namespace {

constexpr int kThreads = 128;  // one block per row

// __float2half_rn rounds to nearest even, as the CPU's F16C conversion does.
__global__ void __launch_bounds__(kThreads)
    store_rows_kernel(bool f16, int64_t width, const float* src, int64_t ld, uint8_t* dst,
                      size_t row_stride, const int32_t* slots) {
    const float* s = src + static_cast<int64_t>(blockIdx.x) * ld;
    uint8_t* d = dst + static_cast<size_t>(slots[blockIdx.x]) * row_stride;
    if (f16) {
        auto* h = reinterpret_cast<__half*>(d);
        for (int64_t i = threadIdx.x; i < width; i += kThreads) h[i] = __float2half_rn(s[i]);
    } else {
        auto* f = reinterpret_cast<float*>(d);
        for (int64_t i = threadIdx.x; i < width; i += kThreads) f[i] = s[i];
    }
}

// T: uint4 when every row start and the row size allow 16-byte words, else uint8_t.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    copy_rows_kernel(uint8_t* dst, size_t dst_stride, const int32_t* dst_rows, const uint8_t* src,
                     size_t src_stride, const int32_t* src_rows, size_t words) {
    const int64_t i = blockIdx.x;
    const auto di = static_cast<size_t>(dst_rows != nullptr ? dst_rows[i] : i);
    const auto si = static_cast<size_t>(src_rows != nullptr ? src_rows[i] : i);
    T* d = reinterpret_cast<T*>(dst + di * dst_stride);
    const T* s = reinterpret_cast<const T*>(src + si * src_stride);
    for (size_t w = threadIdx.x; w < words; w += kThreads) d[w] = s[w];
}

bool aligned16(const void* p, size_t a, size_t b, size_t c) {
    return ((reinterpret_cast<uintptr_t>(p) | a | b | c) & 15) == 0;
}

}  // namespace

cudaError_t launch_store_rows(bool f16, int64_t width, const float* src, int64_t ld, int64_t n,
                              uint8_t* dst, size_t row_stride, const int32_t* slots,
                              cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    store_rows_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(f16, width, src, ld, dst,
                                                                         row_stride, slots);
    return cudaGetLastError();
}

cudaError_t launch_copy_rows(uint8_t* dst, size_t dst_stride, const int32_t* dst_rows,
                             const uint8_t* src, size_t src_stride, const int32_t* src_rows,
                             size_t row_bytes, int64_t n, cudaStream_t stream) {
    if (n <= 0 || row_bytes == 0) return cudaSuccess;
    const auto blocks = static_cast<unsigned>(n);
    if (aligned16(dst, dst_stride, row_bytes, 0) && aligned16(src, src_stride, 0, 0)) {
        copy_rows_kernel<uint4><<<blocks, kThreads, 0, stream>>>(
            dst, dst_stride, dst_rows, src, src_stride, src_rows, row_bytes / 16);
    } else {
        copy_rows_kernel<uint8_t><<<blocks, kThreads, 0, stream>>>(dst, dst_stride, dst_rows, src,
                                                                   src_stride, src_rows, row_bytes);
    }
    return cudaGetLastError();
}

}  // namespace deltaserve::kernels::cuda
