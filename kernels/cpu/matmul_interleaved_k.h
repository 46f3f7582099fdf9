// The matmul micro-kernels of Q4_K and Q6_K over rows interleaved by repack_rows
// (BlockQ4_Kx8, BlockQ6_Kx8): one
// 256-bit register holds the same 4 quants of 8 rows, one integer product with a broadcast
// activation word gives 8 rows' partial sums, and each sub-block's 8 sums are multiplied by
// the 8 rows' scales (vpmulld) into the super-block's int32; the minimums come in through
// the activations' sums (vpmaddwd with each row's minimum twice). The integers are tile_k's
// (matmul_kquants.h) and the super-block's one conversion and FMA per row rounds as there:
// the same bits. Part of matmul_kernels.h (internal linkage, one instantiation per ISA).
#pragma once

#include <cstring>

namespace deltaserve::kernels {
namespace {

// The 8 rows' 6-bit values v (scales 0..7, minimums 8..15) of a BlockQ4_Kx8, one row a lane.
struct RowScalesK4 {
    __m256i v[16];
    explicit RowScalesK4(const BlockQ4_Kx8& b) {
        const auto bytes = [](const uint8_t* p) {
            return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
        };
        const __m256i m4 = _mm256_set1_epi32(0xF), m2 = _mm256_set1_epi32(3);
        for (int q = 0; q < 4; ++q) {
            const __m256i hi = bytes(b.scales_hi[q]);
            for (int i = 0; i < 4; ++i) {
                const int k = 4 * q + i;
                const __m256i lo = bytes(b.scales_lo[k / 2]);
                const __m256i l4 = _mm256_and_si256(_mm256_srli_epi32(lo, 4 * (k % 2)), m4);
                const __m256i h2 = _mm256_and_si256(_mm256_srli_epi32(hi, 2 * i), m2);
                v[k] = _mm256_or_si256(l4, _mm256_slli_epi32(h2, 4));
            }
        }
    }
};

// The activations' sums of values 32j .. 32j + 31 as the pair (bsums[2j], bsums[2j + 1]) in
// every lane.
inline __m256i bsum_pair(const BlockQ8K& a, int j) {
    int32_t v;
    std::memcpy(&v, &a.bsums[2 * j], 4);
    return _mm256_set1_epi32(v);
}

template <class Isa, int C>
inline void x8_q4_k(const uint8_t* group, const Activations& a, int64_t t0, int64_t nb, float* y,
                    int64_t ldy, int64_t r0) {
    const BlockQ4_Kx8* w = reinterpret_cast<const BlockQ4_Kx8*>(group);
    __m256 acc[C], macc[C];
    const BlockQ8K* act[C];
    for (int c = 0; c < C; ++c) {
        acc[c] = macc[c] = _mm256_setzero_ps();
        act[c] = a.qk + (t0 + c) * nb;
    }
    const __m256i mask = _mm256_set1_epi8(0x0F);
    for (int64_t b = 0; b < nb; ++b) {
        prefetch_block<sizeof(BlockQ4_Kx8)>(group, b * sizeof(BlockQ4_Kx8));
        const BlockQ4_Kx8& blk = w[b];
        const RowScalesK4 sc(blk);
        __m256i isum[C];
        for (int c = 0; c < C; ++c) isum[c] = _mm256_setzero_si256();
        for (int p = 0; p < 4; ++p) {  // qs bytes 32p..: sub-blocks 2p (low) and 2p + 1
            __m256i lo_sum[C], hi_sum[C];
            for (int c = 0; c < C; ++c) lo_sum[c] = hi_sum[c] = _mm256_setzero_si256();
            for (int k = 0; k < 8; ++k) {
                const __m256i raw =
                    _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs[8 * p + k]));
                const __m256i lo = _mm256_and_si256(raw, mask);
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
                for (int c = 0; c < C; ++c) {
                    const int8_t* q = act[c][b].qs + 64 * p + 4 * k;
                    lo_sum[c] = Isa::dot_u8s8_add(lo_sum[c], lo, broadcast4(q));
                    hi_sum[c] = Isa::dot_u8s8_add(hi_sum[c], hi, broadcast4(q + 32));
                }
            }
            for (int c = 0; c < C; ++c) {
                isum[c] = _mm256_add_epi32(isum[c], _mm256_mullo_epi32(lo_sum[c], sc.v[2 * p]));
                isum[c] = _mm256_add_epi32(isum[c], _mm256_mullo_epi32(hi_sum[c], sc.v[2 * p + 1]));
            }
        }
        // Each row's minimum j as an int16 pair, for the pair of sums over its 32 values.
        __m256i mins[8];
        for (int j = 0; j < 8; ++j)
            mins[j] = _mm256_or_si256(sc.v[8 + j], _mm256_slli_epi32(sc.v[8 + j], 16));
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.d)));
        const __m256 dmin =
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.dmin)));
        for (int c = 0; c < C; ++c) {
            __m256i msum = _mm256_setzero_si256();
            for (int j = 0; j < 8; ++j)
                msum = _mm256_add_epi32(msum, _mm256_madd_epi16(mins[j], bsum_pair(act[c][b], j)));
            const __m256 ad = _mm256_set1_ps(act[c][b].d);
            acc[c] = block_fma(isum[c], _mm256_mul_ps(d, ad), acc[c]);
            macc[c] = block_fma(msum, _mm256_mul_ps(dmin, ad), macc[c]);
        }
    }
    for (int c = 0; c < C; ++c) {
        _mm256_storeu_ps(y + (t0 + c) * ldy + r0, _mm256_sub_ps(acc[c], macc[c]));
    }
}

// Q6_K: per 16-value half of each 32-value chunk, the 8 rows' sums times their scale; the
// quants' -32 through the activations' sums (32 * sum_k scale_k * bsums[k], vpmaddwd with
// each row's scale pair).
template <class Isa, int C>
inline void x8_q6_k(const uint8_t* group, const Activations& a, int64_t t0, int64_t nb, float* y,
                    int64_t ldy, int64_t r0) {
    const BlockQ6_Kx8* w = reinterpret_cast<const BlockQ6_Kx8*>(group);
    __m256 acc[C];
    const BlockQ8K* act[C];
    for (int c = 0; c < C; ++c) {
        acc[c] = _mm256_setzero_ps();
        act[c] = a.qk + (t0 + c) * nb;
    }
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03);
    const auto load = [](const uint8_t* p) {
        return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    };
    for (int64_t b = 0; b < nb; ++b) {
        prefetch_block<sizeof(BlockQ6_Kx8)>(group, b * sizeof(BlockQ6_Kx8));
        const BlockQ6_Kx8& blk = w[b];
        const auto scale = [&](int k) {  // the rows' scale k, one a lane
            return _mm256_cvtepi8_epi32(
                _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk.scales[k])));
        };
        __m256i isum[C];
        for (int c = 0; c < C; ++c) isum[c] = _mm256_setzero_si256();
        // Half h (128 values); s: the 16-value half of each of its chunks 4h + q.
        for (int h = 0; h < 2; ++h) {
            for (int s = 0; s < 2; ++s) {
                __m256i part[C][4];
                for (int c = 0; c < C; ++c) {
                    for (int q = 0; q < 4; ++q) part[c][q] = _mm256_setzero_si256();
                }
                for (int g = 4 * s; g < 4 * s + 4; ++g) {  // values 4g .. 4g + 3 of each chunk
                    const __m256i l0 = load(blk.ql[16 * h + g]);
                    const __m256i l1 = load(blk.ql[16 * h + 8 + g]);
                    const __m256i hb = load(blk.qh[8 * h + g]);
                    const auto high = [&](int shift) {
                        return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, shift), m2),
                                                 4);
                    };
                    const __m256i v[4] = {
                        _mm256_or_si256(_mm256_and_si256(l0, m4), high(0)),
                        _mm256_or_si256(_mm256_and_si256(l1, m4), high(2)),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), high(4)),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), high(6))};
                    for (int c = 0; c < C; ++c) {
                        const int8_t* x = act[c][b].qs + 128 * h + 4 * g;
                        for (int q = 0; q < 4; ++q) {
                            part[c][q] =
                                Isa::dot_u8s8_add(part[c][q], v[q], broadcast4(x + 32 * q));
                        }
                    }
                }
                for (int q = 0; q < 4; ++q) {
                    const __m256i sc = scale(2 * (4 * h + q) + s);
                    for (int c = 0; c < C; ++c)
                        isum[c] = _mm256_add_epi32(isum[c], _mm256_mullo_epi32(part[c][q], sc));
                }
            }
        }
        // Each row's scales 2j and 2j + 1 as an int16 pair.
        __m256i pairs[8];
        for (int j = 0; j < 8; ++j) {
            pairs[j] = _mm256_or_si256(_mm256_and_si256(scale(2 * j), _mm256_set1_epi32(0xFFFF)),
                                       _mm256_slli_epi32(scale(2 * j + 1), 16));
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.d)));
        for (int c = 0; c < C; ++c) {
            __m256i off = _mm256_setzero_si256();
            for (int j = 0; j < 8; ++j)
                off = _mm256_add_epi32(off, _mm256_madd_epi16(pairs[j], bsum_pair(act[c][b], j)));
            isum[c] = _mm256_sub_epi32(isum[c], _mm256_slli_epi32(off, 5));
            acc[c] = block_fma(isum[c], _mm256_mul_ps(d, _mm256_set1_ps(act[c][b].d)), acc[c]);
        }
    }
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(y + (t0 + c) * ldy + r0, acc[c]);
}

}  // namespace
}  // namespace deltaserve::kernels
