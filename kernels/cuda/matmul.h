// Device side of the matmuls (matmul.cu). Plain C++: the backend (cuda_backend.cpp)
// validates shapes and owns the scratch; every pointer here is device memory. Launchers
// enqueue on `stream` and return the launch error.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "deltaserve/kernels/dtype.h"

namespace deltaserve::kernels::cuda {

// The weight types the matmul and embed_rows kernels read, in row-major layout. Q5_0, Q5_1,
// IQ4_NL, the K-quants and IQ4_XS are read one element at a time (weight_value) against
// fp32 activations: correct, not yet fast (no integer block sums on the device).
inline bool weight_type_supported(DType t) {
    switch (t) {
        case DType::kF32:
        case DType::kF16:
        case DType::kBF16:
        case DType::kQ4_0:
        case DType::kQ4_1:
        case DType::kQ5_0:
        case DType::kQ5_1:
        case DType::kQ8_0:
        case DType::kIQ4_NL:
        case DType::kQ2_K:
        case DType::kQ3_K:
        case DType::kQ4_K:
        case DType::kQ5_K:
        case DType::kQ6_K:
        case DType::kIQ4_XS:
            return true;
        default:
            return false;
    }
}

// The types repack_rows interleaves (kernels/repack.h), which upload_weight turns back into
// rows (row_major.h).
inline bool interleaved_type(DType t) {
    return t == DType::kQ4_0 || t == DType::kQ4_1 || t == DType::kQ8_0 || t == DType::kQ4_K ||
           t == DType::kQ6_K;
}

// The types multiplied with int8-quantized activations, as kernels::matmul does on the CPU
// (so that both give the same sums); the float types take the fp32 activations.
inline bool uses_int8_activations(DType t) {
    return t == DType::kQ4_0 || t == DType::kQ4_1 || t == DType::kQ8_0;
}

// Bytes of the int8 activation blocks (BlockQ8A, kernels/cpu/blocks.h) of n rows of cols
// values (a multiple of 32).
size_t activation_bytes(int64_t n, int64_t cols);

// n rows of cols floats, ldx apart, into activation blocks (row after row) with the
// rounding of kernels::quantize_activations.
cudaError_t launch_quantize_activations(const float* x, int64_t ldx, int64_t n, int64_t cols,
                                        void* blocks, cudaStream_t stream);

// y[t * ldy + r] = sum_c W[r][c] * x[t][c] for t < n, r < rows.
struct MatmulLaunch {
    DType type = DType::kF32;  // weight_type_supported
    const void* w = nullptr;   // rows of row_stride bytes, row-major
    size_t row_stride = 0;
    int64_t rows = 0;          // <= INT32_MAX
    int64_t cols = 0;          // a multiple of 32 for the int8 types
    const float* x = nullptr;  // the float types: fp32 rows, ldx apart
    int64_t ldx = 0;
    const void* xq = nullptr;  // the int8 types: launch_quantize_activations' blocks of x
    int64_t n = 0;
    float* y = nullptr;
    int64_t ldy = 0;
};
cudaError_t launch_matmul(const MatmulLaunch& args, cudaStream_t stream);

}  // namespace deltaserve::kernels::cuda
