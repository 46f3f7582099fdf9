// The int4 latent kernels with AVX-512.
// - The decoder's dot products (VNNI): vpdpbusd multiplies four codes (unsigned) by four
//   int8 weights of 16 rows at once; tiles of 4 tokens x 64 rows keep 16 accumulators in
//   registers while the weights stream once per tile. (4 x 96 rows, 24 accumulators and 6
//   weight registers, left GCC 12 copying registers and spilling: 1.6x slower on the default
//   model's 192 K rows.)
// - latent_attention's weighted code sums: up to 8 heads x 32 columns of accumulators; each
//   token's codes are widened to floats once for all those heads.
#include <immintrin.h>

#include <cstring>

#include "../deltakv_int4_kernels.h"

namespace deltaserve::kernels {

namespace {

template <int T, int RB>
void tile(const Int4DecoderRef& dec, const uint8_t* codes, int r0, int32_t* acc) {
    __m512i a[T][RB];
    for (int t = 0; t < T; ++t) {
        for (int b = 0; b < RB; ++b) a[t][b] = _mm512_setzero_si512();
    }
    const int8_t* w = dec.w + static_cast<size_t>(r0) * 4;
    const size_t step = static_cast<size_t>(dec.d) * 4;
    for (int j4 = 0; j4 < dec.m16 / 4; ++j4, w += step) {
        __m512i wv[RB];
        for (int b = 0; b < RB; ++b) wv[b] = _mm512_loadu_si512(w + 64 * b);
        for (int t = 0; t < T; ++t) {
            int32_t q4;
            std::memcpy(&q4, codes + static_cast<size_t>(t) * dec.m16 + 4 * j4, 4);
            const __m512i q = _mm512_set1_epi32(q4);
            for (int b = 0; b < RB; ++b) a[t][b] = _mm512_dpbusd_epi32(a[t][b], q, wv[b]);
        }
    }
    for (int t = 0; t < T; ++t) {
        for (int b = 0; b < RB; ++b)
            _mm512_storeu_si512(acc + static_cast<size_t>(t) * dec.d + r0 + 16 * b, a[t][b]);
    }
}

template <int T>
void tokens(const Int4DecoderRef& dec, const uint8_t* codes, int32_t* acc) {
    int r = 0;
    for (; r + 64 <= dec.d; r += 64) tile<T, 4>(dec, codes, r, acc);
    if (r + 48 <= dec.d) {  // a few key dimensions (int4_decoder_rows): 12 accumulators, not 4
        tile<T, 3>(dec, codes, r, acc);
        r += 48;
    }
    for (; r + 16 <= dec.d; r += 16) tile<T, 1>(dec, codes, r, acc);
    for (int t = 0; t < T; ++t) {
        int4_dots_rows(dec, codes + static_cast<size_t>(t) * dec.m16, r,
                       acc + static_cast<size_t>(t) * dec.d);
    }
}

// GCC 12 warns that the widening intrinsics' "undefined" source may be uninitialized (GCC
// bug 105593, fixed in 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// H heads x NV * 16 columns from c0, accumulated over n tokens in registers.
template <int H, int NV>
void weighted_pass(const float* w, int64_t ldw, const uint8_t* codes, int64_t ldc, int64_t n,
                   int c0, float* acc, int64_t lda) {
    __m512 a[H][NV];
    for (int h = 0; h < H; ++h) {
        for (int v = 0; v < NV; ++v) a[h][v] = _mm512_loadu_ps(acc + h * lda + c0 + 16 * v);
    }
    for (int64_t i = 0; i < n; ++i) {
        __m512 c[NV];
        for (int v = 0; v < NV; ++v) {
            c[v] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i * ldc + c0 + 16 * v))));
        }
        for (int h = 0; h < H; ++h) {
            const __m512 wh = _mm512_set1_ps(w[h * ldw + i]);
            for (int v = 0; v < NV; ++v) a[h][v] = _mm512_fmadd_ps(wh, c[v], a[h][v]);
        }
    }
    for (int h = 0; h < H; ++h) {
        for (int v = 0; v < NV; ++v) _mm512_storeu_ps(acc + h * lda + c0 + 16 * v, a[h][v]);
    }
}

#pragma GCC diagnostic pop

template <int H>
void weighted_heads(const float* w, int64_t ldw, const uint8_t* codes, int64_t ldc, int64_t n,
                    int cols, float* acc, int64_t lda) {
    int c0 = 0;
    for (; c0 + 32 <= cols; c0 += 32) weighted_pass<H, 2>(w, ldw, codes, ldc, n, c0, acc, lda);
    if (c0 < cols) weighted_pass<H, 1>(w, ldw, codes, ldc, n, c0, acc, lda);
}

}  // namespace

void int4_weighted_avx512(const float* w, int64_t ldw, int heads, const uint8_t* codes, int64_t ldc,
                          int64_t n, int cols, float* acc, int64_t lda) {
    using Fn =
        void (*)(const float*, int64_t, const uint8_t*, int64_t, int64_t, int, float*, int64_t);
    static constexpr Fn kHeads[] = {weighted_heads<1>, weighted_heads<2>, weighted_heads<3>,
                                    weighted_heads<4>, weighted_heads<5>, weighted_heads<6>,
                                    weighted_heads<7>, weighted_heads<8>};
    // Heads in even groups of at most 8 (9 heads: 4 and 5).
    const int groups = (heads + 7) / 8;
    for (int h0 = 0, g = 0; g < groups; ++g) {
        const int hn = (heads - h0) / (groups - g);
        kHeads[hn - 1](w + h0 * ldw, ldw, codes, ldc, n, cols, acc + h0 * lda, lda);
        h0 += hn;
    }
}

#pragma GCC diagnostic push  // GCC bug 105593, as above
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

void int4_finish_avx512(const Int4DecoderRef& dec, const int32_t* acc, float s, float lo,
                        const float* const* rows, int n_rows, const float* c, const float* sn,
                        int rope_dims, int head_dim, float* y) {
    const __m512 sv = _mm512_set1_ps(s), lov = _mm512_set1_ps(lo);
    const __m512 inv = _mm512_set1_ps(n_rows > 0 ? 1.0f / static_cast<float>(n_rows) : 0.0f);
    // A pair's angle in both of its lanes; the sine negated in the first: (a, b) ->
    // (a c - b s, b c + a s) = (a, b) c + (b, a) (-s, s).
    const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m512 alt = _mm512_setr_ps(-1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1);
    for (int r = 0; r < dec.d; r += 16) {
        const __m512 v = _mm512_cvtepi32_ps(_mm512_loadu_si512(acc + r));
        const __m512 w = _mm512_mul_ps(sv, _mm512_loadu_ps(dec.scale + r));
        __m512 x = _mm512_fmadd_ps(w, v, _mm512_mul_ps(lov, _mm512_loadu_ps(dec.row_sum + r)));
        if (n_rows > 0) {
            __m512 sum = _mm512_loadu_ps(rows[0] + r);
            for (int q = 1; q < n_rows; ++q) sum = _mm512_add_ps(sum, _mm512_loadu_ps(rows[q] + r));
            x = _mm512_fmadd_ps(sum, inv, x);
        }
        if (r < rope_dims) {
            const int j = r % head_dim / 2;  // the first pair's angle
            const __m512 cc =
                _mm512_permutexvar_ps(dup, _mm512_zextps256_ps512(_mm256_loadu_ps(c + j)));
            const __m512 ss = _mm512_mul_ps(
                _mm512_permutexvar_ps(dup, _mm512_zextps256_ps512(_mm256_loadu_ps(sn + j))), alt);
            x = _mm512_fmadd_ps(_mm512_permute_ps(x, 0xB1), ss, _mm512_mul_ps(x, cc));
        }
        _mm512_storeu_ps(y + r, x);
    }
}

#pragma GCC diagnostic pop

void int4_codes_avx512(const uint8_t* packed, int m, uint8_t* q) {
    // 32 packed bytes at a time: each widened to 16 bits, its low nibble in the low byte and
    // its high nibble in the high byte, so 64 codes land in order.
    const __m512i nib = _mm512_set1_epi16(15);
    int j = 0;
    for (; j + 64 <= m; j += 64) {
        const __m512i w = _mm512_cvtepu8_epi16(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(packed + j / 2)));
        const __m512i codes = _mm512_or_si512(_mm512_and_si512(w, nib),
                                              _mm512_slli_epi16(_mm512_srli_epi16(w, 4), 8));
        _mm512_storeu_si512(q + j, codes);
    }
    if (j < m) int4_codes(packed + j / 2, m - j, q + j);
}

void int4_dots_avx512(const Int4DecoderRef& dec, const uint8_t* codes, int64_t n, int32_t* acc) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) tokens<4>(dec, codes + i * dec.m16, acc + i * dec.d);
    for (; i < n; ++i) tokens<1>(dec, codes + i * dec.m16, acc + i * dec.d);
}

}  // namespace deltaserve::kernels
