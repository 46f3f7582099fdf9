// The per-ISA matmul entry points the dispatcher chooses from. Private to kernels/.
#pragma once

#include <cstdint>

#include "blocks.h"
#include "deltaserve/kernels/dtype.h"
#include "deltaserve/kernels/matmul.h"

namespace deltaserve::kernels {

// The activations of one matmul: fp32 rows, and their int8 blocks when the weight type
// uses the integer kernels (q for the 32-blocks, qk for the K-quants and IQ4_XS).
struct Activations {
    const float* x = nullptr;
    int64_t ldx = 0;
    const BlockQ8A* q = nullptr;  // n_tokens * (cols / 32) blocks
    int64_t n_tokens = 0;
    const BlockQ8K* qk = nullptr;  // n_tokens * (cols / 256) blocks
};

// Computes rows [r0, r1) of y for every token.
using RowsFn = void (*)(const WeightMatrix& w, const Activations& a, float* y, int64_t ldy,
                        int64_t r0, int64_t r1);

// The quantized kernels in one summation order (DotOrder).
struct QuantKernels {
    RowsFn q4_0, q4_1, q8_0;
    // The same over rows interleaved by repack_rows; r0 and r1 multiples of kRowInterleave.
    RowsFn q4_0x8, q4_1x8, q8_0x8;
    // The same functions in both orders (no kGgml variant yet); row-major but the last two.
    RowsFn q5_0, q5_1, iq4_nl;                    // against BlockQ8A
    RowsFn q2_k, q3_k, q4_k, q5_k, q6_k, iq4_xs;  // against BlockQ8K
    RowsFn q4_kx8, q6_kx8;                        // interleaved, as q4_0x8
};

struct MatmulTable {
    const char* isa;
    QuantKernels quant[2];  // by DotOrder
    RowsFn f32, f16, bf16;
};

const MatmulTable& avx2_matmul_table();
const MatmulTable& avx512_matmul_table();

}  // namespace deltaserve::kernels
