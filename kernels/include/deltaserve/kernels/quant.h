// Conversions between fp32 rows and the block formats of dtype.h.
#pragma once

#include <cstdint>

#include "deltaserve/kernels/dtype.h"

namespace deltaserve::kernels {

// dst[0..n) = the values of one row of type t (n a multiple of the block size). Supported:
// F32, F16, BF16, Q4_0, Q4_1, Q8_0, Q6_K.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);

// Quantizes one row of n floats to type t with ggml's reference rounding. Supported: F32,
// F16, BF16, Q4_0, Q4_1, Q8_0. Used for tests and conversions, not on the hot path.
void quantize_row(DType t, const float* src, void* dst, int64_t n);

}  // namespace deltaserve::kernels
