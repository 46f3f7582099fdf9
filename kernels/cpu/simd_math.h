// Vector math helpers for the AVX2 baseline. Private to kernels/; internal linkage.
#pragma once

#include <immintrin.h>

namespace deltaserve::kernels {
namespace {

// Folds 8 vectors of partial sums into one vector of their 8 totals.
inline __m256 reduce8(const __m256* v) {
    const __m256 a = _mm256_hadd_ps(v[0], v[1]);
    const __m256 b = _mm256_hadd_ps(v[2], v[3]);
    const __m256 c = _mm256_hadd_ps(v[4], v[5]);
    const __m256 d = _mm256_hadd_ps(v[6], v[7]);
    const __m256 ab = _mm256_hadd_ps(a, b);  // per lane half: keys 0-3 (low), 0-3 (high)
    const __m256 cd = _mm256_hadd_ps(c, d);
    const __m256 lo = _mm256_permute2f128_ps(ab, cd, 0x20);
    const __m256 hi = _mm256_permute2f128_ps(ab, cd, 0x31);
    return _mm256_add_ps(lo, hi);
}

// Sum of x[i] * y[i] (or of (x[i] - y[i])^2) in 16 lanes, then reduced.
template <bool kSquaredDiff>
inline float dot8(const float* x, const float* y, int d) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= d; i += 16) {
        __m256 u0 = _mm256_loadu_ps(x + i), u1 = _mm256_loadu_ps(x + i + 8);
        __m256 v0 = _mm256_loadu_ps(y + i), v1 = _mm256_loadu_ps(y + i + 8);
        if constexpr (kSquaredDiff) {
            u0 = _mm256_sub_ps(u0, v0);
            u1 = _mm256_sub_ps(u1, v1);
            v0 = u0;
            v1 = u1;
        }
        a0 = _mm256_fmadd_ps(u0, v0, a0);
        a1 = _mm256_fmadd_ps(u1, v1, a1);
    }
    const __m256 a = _mm256_add_ps(a0, a1);
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    float s = _mm_cvtss_f32(r);
    for (; i < d; ++i) s += kSquaredDiff ? (x[i] - y[i]) * (x[i] - y[i]) : x[i] * y[i];
    return s;
}

// Eight dot8<false>(x[r], y[r], d), d a multiple of 16: the same sums in the same order as
// eight dot8 calls (each dot's two accumulators, then its lanes i + 4, then j + 2, then the
// last pair), the horizontal steps of the eight taken together. The results come in the
// order 0, 2, 4, 6, 1, 3, 5, 7.
inline __m256 dot8_rows8(const float* const* x, const float* const* y, int d) {
    __m256 a[8];
    for (int r = 0; r < 8; ++r) {
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        for (int i = 0; i < d; i += 16) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x[r] + i), _mm256_loadu_ps(y[r] + i), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x[r] + i + 8), _mm256_loadu_ps(y[r] + i + 8), a1);
        }
        a[r] = _mm256_add_ps(a0, a1);
    }
    // Lanes i + (i + 4): rows (0, 1), (2, 3), (4, 5), (6, 7) in the halves of one vector.
    __m256 h[4];
    for (int p = 0; p < 4; ++p) {
        h[p] = _mm256_add_ps(_mm256_permute2f128_ps(a[2 * p], a[2 * p + 1], 0x20),
                             _mm256_permute2f128_ps(a[2 * p], a[2 * p + 1], 0x31));
    }
    // Lanes j + (j + 2) within each half.
    const __m256 q0 = _mm256_add_ps(_mm256_shuffle_ps(h[0], h[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm256_shuffle_ps(h[0], h[1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m256 q1 = _mm256_add_ps(_mm256_shuffle_ps(h[2], h[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm256_shuffle_ps(h[2], h[3], _MM_SHUFFLE(3, 2, 3, 2)));
    // The last pair.
    return _mm256_add_ps(_mm256_shuffle_ps(q0, q1, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm256_shuffle_ps(q0, q1, _MM_SHUFFLE(3, 1, 3, 1)));
}

// exp(x) for 8 floats, max error ~1.5 ulp. The same algorithm and rounding steps as ggml's
// AVX-512 ggml_v_expf (x = n ln2 + b, a degree-5 polynomial in b, then a scale by 2^n), so
// that SiLU and softmax round as llama.cpp's do. Results above ~88.7 are +inf, below ~-103.9
// zero.
inline __m256 exp256(__m256 x) {
    const __m256 r = _mm256_set1_ps(0x1.8p23f);
    const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), r);
    const __m256 n = _mm256_sub_ps(z, r);
    const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                      _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(
            _mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)), u,
            _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f))),
        u, _mm256_fmadd_ps(_mm256_set1_ps(0x1.ffffecp-1f), b, _mm256_set1_ps(1.0f)));
    // j * 2^n with a single rounding: 2^n split in two factors that are both normal floats
    // (|n| <= 192 here), the first product exact.
    const __m256 abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
    const __m256 nc =
        _mm256_max_ps(_mm256_min_ps(n, _mm256_set1_ps(192.0f)), _mm256_set1_ps(-192.0f));
    const __m256i ni = _mm256_cvtps_epi32(nc);
    const __m256i n1 = _mm256_srai_epi32(ni, 1);
    const __m256i n2 = _mm256_sub_epi32(ni, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    const __m256 res = _mm256_mul_ps(_mm256_mul_ps(j, s1), s2);
    const __m256 big = _mm256_cmp_ps(abs_n, _mm256_set1_ps(192.0f), _CMP_GT_OQ);
    if (_mm256_movemask_ps(big) == 0) return res;
    const __m256 alt = _mm256_blendv_ps(_mm256_set1_ps(__builtin_inff()), _mm256_setzero_ps(),
                                        _mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ));
    return _mm256_blendv_ps(res, alt, big);
}

}  // namespace
}  // namespace deltaserve::kernels
