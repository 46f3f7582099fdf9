// Dequantization of the K-quant super-blocks (and IQ4_XS), as ggml-quants.c's
// dequantize_row_*: each value is the same fp32 expression, so the same bits. Private to
// kernels/; quant.cpp's dequantize_row dispatches here.
#pragma once

#include <cstdint>

#include "blocks.h"

namespace deltaserve::kernels {

// y[0 .. 256 nb) from nb blocks.
void dequantize_q2_k(const BlockQ2_K* b, float* y, int64_t nb);
void dequantize_q3_k(const BlockQ3_K* b, float* y, int64_t nb);
void dequantize_q4_k(const BlockQ4_K* b, float* y, int64_t nb);
void dequantize_q5_k(const BlockQ5_K* b, float* y, int64_t nb);
void dequantize_q6_k(const BlockQ6_K* b, float* y, int64_t nb);
void dequantize_iq4_xs(const BlockIQ4_XS* b, float* y, int64_t nb);

}  // namespace deltaserve::kernels
