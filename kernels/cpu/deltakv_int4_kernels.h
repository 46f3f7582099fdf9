// The int4 latent decoder's integer dot products per ISA (deltakv.h). Private to kernels/.
#pragma once

#include <cstdint>

#include "deltaserve/kernels/deltakv.h"

namespace deltaserve::kernels {

// acc[i * dec.d + r] = sum_j w8[r][j] * codes[i * dec.m16 + j] for n tokens whose codes
// (0..15, one byte each, zero past m) are m16 bytes apart. Exact in every version.
using Int4DotsFn = void (*)(const Int4DecoderRef& dec, const uint8_t* codes, int64_t n,
                            int32_t* acc);

void int4_dots_avx2(const Int4DecoderRef& dec, const uint8_t* codes, int64_t n, int32_t* acc);
void int4_dots_avx512(const Int4DecoderRef& dec, const uint8_t* codes, int64_t n, int32_t* acc);

// A packed int4 latent's m codes (int4_pack's format, past its scale and min), one byte each.
void int4_codes(const uint8_t* packed, int m, uint8_t* codes);
void int4_codes_avx512(const uint8_t* packed, int m, uint8_t* codes);  // the same, 64 at a time

// acc[h * lda + j] += sum_i w[h * ldw + i] * codes[i * ldc + j] for heads h, n tokens i and
// cols j (a multiple of 16): latent_attention's weighted sums, the weights folding in each
// token's scale. One FMA per token in token order for every (h, j): every version gives the
// same bits.
using Int4WeightedFn = void (*)(const float* w, int64_t ldw, int heads, const uint8_t* codes,
                                int64_t ldc, int64_t n, int cols, float* acc, int64_t lda);

void int4_weighted_avx2(const float* w, int64_t ldw, int heads, const uint8_t* codes, int64_t ldc,
                        int64_t n, int cols, float* acc, int64_t lda);
void int4_weighted_avx512(const float* w, int64_t ldw, int heads, const uint8_t* codes, int64_t ldc,
                          int64_t n, int cols, float* acc, int64_t lda);

// deltakv_decode_int4's last pass over one token's row with an Int4KeyFinish, in registers
// (AVX-512; dec.d, rope_dims and head_dim multiples of 16, interleaved RoPE):
// y = s * scale * acc + lo * row_sum, then y += the mean of n_rows rows, then RoPE at the
// angles (c, sn) on the first rope_dims values. Each value takes the operations of the
// generic path (the conversion, add_mean_rows, rope_apply) in their order: the same bits.
void int4_finish_avx512(const Int4DecoderRef& dec, const int32_t* acc, float s, float lo,
                        const float* const* rows, int n_rows, const float* c, const float* sn,
                        int rope_dims, int head_dim, float* y);

// The rows an ISA's vector loop leaves over (r from `from` to d), one at a time.
inline void int4_dots_rows(const Int4DecoderRef& dec, const uint8_t* q, int from, int32_t* acc) {
    for (int r = from; r < dec.d; ++r) {
        int32_t s = 0;
        for (int j = 0; j < dec.m16; ++j)
            s += dec.w[(static_cast<size_t>(j / 4) * dec.d + r) * 4 + j % 4] * q[j];
        acc[r] = s;
    }
}

}  // namespace deltaserve::kernels
