// Matrix products against weight matrices, computed directly on their blocks.
#pragma once

#include <cstdint>
#include <string_view>

#include "deltaserve/common/thread_pool.h"
#include "deltaserve/kernels/dtype.h"

namespace deltaserve::kernels {

// y[t * ldy + r] = sum_k W[r][k] * x[t * ldx + k], for t < n_tokens and r < w.rows.
// Quantized weights (Q4_0, Q4_1, Q8_0) are multiplied with int8-quantized activations
// (one scale per 32 values, as llama.cpp does); float weights in fp32. Splits the rows
// over the pool's threads. x and y must not overlap.
void matmul(const WeightMatrix& w, const float* x, int64_t ldx, int64_t n_tokens, float* y,
            int64_t ldy, ThreadPool& pool);

// Rows [r0, r1) only, on the calling thread (for callers that split work themselves).
void matmul_rows(const WeightMatrix& w, const float* x, int64_t ldx, int64_t n_tokens, float* y,
                 int64_t ldy, int64_t r0, int64_t r1);

// The instruction set the kernels dispatch to on this CPU: "avx512-vnni" or "avx2".
std::string_view cpu_kernel_isa();

}  // namespace deltaserve::kernels
