// Conversions between fp32 rows and the block formats of dtype.h.
#pragma once

#include <cstdint>

#include "deltaserve/kernels/dtype.h"

namespace deltaserve::kernels {

// dst[0..n) = the values of one row of type t (n a multiple of the block size), the bits of
// ggml's dequantize_row_* (tests/kernels/quant_test.cpp holds them to the gguf package's).
// Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K,
// Q6_K, IQ4_XS. Any block bytes are valid: non-finite scales give non-finite values.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);

// Quantizes one row of n floats to type t with ggml's reference rounding. Supported: F32,
// F16, BF16, Q4_0, Q4_1, Q8_0. Used for tests and conversions, not on the hot path.
void quantize_row(DType t, const float* src, void* dst, int64_t n);

}  // namespace deltaserve::kernels
