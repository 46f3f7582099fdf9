// Matrix products against weight matrices, computed directly on their blocks.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "deltaserve/common/thread_pool.h"
#include "deltaserve/kernels/dtype.h"

namespace deltaserve::kernels {

// How a quantized row's products are summed. kBlock: each block of 32 (a K-quant's
// super-block of 256) in integers (exact), then one FMA per block into the row's accumulator;
// fastest, and the same bits for any layout, tile, token count or instruction set. kGgml:
// llama.cpp's vec_dot order (8 fp32 lanes per row, each block's 8 partial sums converted and added,
// the lanes summed at the end), for logits equal to llama.cpp's (--attention ggml). The two differ
// in the last bits.
enum class DotOrder { kBlock = 0, kGgml = 1 };

// y[t * ldy + r] = sum_k W[r][k] * x[t * ldx + k], for t < n_tokens and r < w.rows.
// Quantized weights are multiplied with int8-quantized activations, as llama.cpp does: one
// fp16-rounded scale per 32 values for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and IQ4_NL; one fp32
// scale per 256 (ggml's Q8_K) for the K-quants Q2_K..Q6_K and IQ4_XS. Summed in `order`
// (the types other than Q4_0, Q4_1 and Q8_0 sum in kBlock's order in both); float weights
// in fp32.
// Splits the rows over the pool's threads. x and y must not overlap.
void matmul(const WeightMatrix& w, const float* x, int64_t ldx, int64_t n_tokens, float* y,
            int64_t ldy, ThreadPool& pool, DotOrder order = DotOrder::kBlock);

// One output of matmul_shared_input: y = W x with its own row stride.
struct MatmulOutput {
    const WeightMatrix* w = nullptr;
    float* y = nullptr;
    int64_t ldy = 0;
};

// Several matrices applied to the same input (Q, K and V; gate and up): the activations are
// quantized once and all rows are shared out in one parallel region. Every w must have the
// same cols; y buffers must not overlap x or each other.
void matmul_shared_input(std::span<const MatmulOutput> outputs, const float* x, int64_t ldx,
                         int64_t n_tokens, ThreadPool& pool, DotOrder order = DotOrder::kBlock);

// The instruction set the kernels dispatch to on this CPU: "avx512-vnni" or "avx2".
std::string_view cpu_kernel_isa();

}  // namespace deltaserve::kernels
