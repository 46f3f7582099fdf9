// The int4 latent decoder's dot products with AVX-512 VNNI: vpdpbusd multiplies four codes
// (unsigned) by four int8 weights of 16 rows at once; tiles of 4 tokens x 64 rows keep 16
// accumulators in registers while the weights stream once per tile. (4 x 96 rows, 24
// accumulators and 6 weight registers, left GCC 12 copying registers and spilling: 1.6x
// slower on the default model's 192 K rows.)
#include <immintrin.h>

#include <cstring>

#include "../deltakv_int4_kernels.h"

namespace deltaserve::kernels {

namespace {

template <int T, int RB>
void tile(const Int4Decoder& dec, const uint8_t* codes, int r0, int32_t* acc) {
    __m512i a[T][RB];
    for (int t = 0; t < T; ++t) {
        for (int b = 0; b < RB; ++b) a[t][b] = _mm512_setzero_si512();
    }
    const int8_t* w = dec.w.data() + static_cast<size_t>(r0) * 4;
    const size_t step = static_cast<size_t>(dec.d) * 4;
    for (int j4 = 0; j4 < dec.m4 / 4; ++j4, w += step) {
        __m512i wv[RB];
        for (int b = 0; b < RB; ++b) wv[b] = _mm512_loadu_si512(w + 64 * b);
        for (int t = 0; t < T; ++t) {
            int32_t q4;
            std::memcpy(&q4, codes + static_cast<size_t>(t) * dec.m4 + 4 * j4, 4);
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
void tokens(const Int4Decoder& dec, const uint8_t* codes, int32_t* acc) {
    int r = 0;
    for (; r + 64 <= dec.d; r += 64) tile<T, 4>(dec, codes, r, acc);
    if (r + 48 <= dec.d) {  // a few key dimensions (int4_decoder_rows): 12 accumulators, not 4
        tile<T, 3>(dec, codes, r, acc);
        r += 48;
    }
    for (; r + 16 <= dec.d; r += 16) tile<T, 1>(dec, codes, r, acc);
    for (int t = 0; t < T; ++t) {
        int4_dots_rows(dec, codes + static_cast<size_t>(t) * dec.m4, r,
                       acc + static_cast<size_t>(t) * dec.d);
    }
}

}  // namespace

void int4_dots_avx512(const Int4Decoder& dec, const uint8_t* codes, int64_t n, int32_t* acc) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) tokens<4>(dec, codes + i * dec.m4, acc + i * dec.d);
    for (; i < n; ++i) tokens<1>(dec, codes + i * dec.m4, acc + i * dec.d);
}

}  // namespace deltaserve::kernels
