// Matmul micro-kernels of the K-quants (Q2_K..Q6_K) and IQ4_XS against Q8_K activations
// (BlockQ8K: 256 int8 values, one fp32 scale, sums per 16). A row's products over a whole
// super-block of 256 are one exact int32: each 32-element chunk's pair sums are multiplied
// by their sub-block scales in integers (maddubs, then madd / vpdpwssd with the scales), and
// the weights' offsets (Q3_K's -4, Q6_K's -32) come in through the activations' sums. The
// super-block then takes one conversion and one FMA (block_fma), and a second into the
// row's minimum accumulator for the types with minimums (Q2_K, Q4_K, Q5_K: y = acc - macc).
// The same integers on every ISA and tile, so the same bits. Part of matmul_kernels.h
// (internal linkage, one instantiation per ISA); it uses that header's helpers.
#pragma once

#include <cstring>

namespace deltaserve::kernels {
namespace {

// A weight super-block's scales as the kernels use them: sc and m hold 16 int16, the k-th
// for values 16k .. 16k + 15 (types with 8 sub-blocks repeat each twice), so 32-bit word j
// holds chunk j's two; d and dmin as fp32.
struct KScales {
    __m256i sc, m;
    float d, dmin;
};

inline __m256i load256(const uint8_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
inline __m128i load128(const void* p) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

// The 32-byte chunk's bits [shift, shift + width) of every byte, as bytes.
inline __m256i bits_of(__m256i v, int shift, int width) {
    return _mm256_and_si256(_mm256_srli_epi16(v, shift), _mm256_set1_epi8((1 << width) - 1));
}

// 8 unsigned bytes, each repeated twice, as 16 int16.
inline __m256i twice_u8(__m128i v8) { return _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(v8, v8)); }

// Each type: Block, kHasMin (the minimum term), kOffset (subtracted from every quant, folded
// in through the activations' sums), kSigned (signed quants: the sign trick), scales() and
// chunk(j): values 32j .. 32j + 31 as bytes in element order.
struct KQ2 {
    using Block = BlockQ2_K;
    static constexpr bool kHasMin = true, kSigned = false;
    static constexpr int kOffset = 0;
    static KScales scales(const Block& b) {
        const __m128i raw = load128(b.scales);
        const __m128i lo = _mm_and_si128(raw, _mm_set1_epi8(0xF));
        const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0xF));
        return {_mm256_cvtepu8_epi16(lo), _mm256_cvtepu8_epi16(hi), half_to_float(b.d),
                half_to_float(b.dmin)};
    }
    static __m256i chunk(const Block& b, int j) {
        return bits_of(load256(b.qs + 32 * (j / 4)), 2 * (j % 4), 2);
    }
};

struct KQ3 {
    using Block = BlockQ3_K;
    static constexpr bool kHasMin = false, kSigned = false;
    static constexpr int kOffset = 4;  // value = low 2 bits + 4 * high bit - 4
    static KScales scales(const Block& b) {
        // ggml's unpacking of the 16 6-bit scales (dequantize_row_q3_K).
        uint32_t aux[4];
        std::memcpy(aux, b.scales, 12);
        const uint32_t tmp = aux[2], m2 = 0x0f0f0f0f, m1 = 0x03030303;
        aux[2] = ((aux[0] >> 4) & m2) | (((tmp >> 4) & m1) << 4);
        aux[3] = ((aux[1] >> 4) & m2) | (((tmp >> 6) & m1) << 4);
        aux[0] = (aux[0] & m2) | (((tmp >> 0) & m1) << 4);
        aux[1] = (aux[1] & m2) | (((tmp >> 2) & m1) << 4);
        // From registers: four 32-bit stores read back as one 128-bit load would stall on
        // store forwarding.
        const __m128i sc =
            _mm_sub_epi8(_mm_setr_epi32(static_cast<int>(aux[0]), static_cast<int>(aux[1]),
                                        static_cast<int>(aux[2]), static_cast<int>(aux[3])),
                         _mm_set1_epi8(32));
        return {_mm256_cvtepi8_epi16(sc), _mm256_setzero_si256(), half_to_float(b.d), 0.0f};
    }
    static __m256i chunk(const Block& b, int j) {
        const __m256i lo = bits_of(load256(b.qs + 32 * (j / 4)), 2 * (j % 4), 2);
        const __m256i hi = bits_of(load256(b.hmask), j, 1);
        return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 2));
    }
};

// Q4_K and Q5_K's 8 scales and minimums of 6 bits (ggml's utmp unpacking): bytes 0..7 the
// scales, 8..15 the minimums.
template <class Block>
inline KScales scales_k4(const Block& b) {
    uint32_t u[4];
    std::memcpy(u, b.scales, 12);
    const uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
    u[3] = ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4);
    const uint32_t mins_lo = u[1] & k1;
    u[1] = (u[2] & k2) | (((u[0] >> 6) & k3) << 4);
    u[2] = mins_lo;
    u[0] &= k1;
    const __m128i v = _mm_setr_epi32(static_cast<int>(u[0]), static_cast<int>(u[1]),
                                     static_cast<int>(u[2]), static_cast<int>(u[3]));
    return {twice_u8(v), twice_u8(_mm_srli_si128(v, 8)), half_to_float(b.d), half_to_float(b.dmin)};
}

struct KQ4 {
    using Block = BlockQ4_K;
    static constexpr bool kHasMin = true, kSigned = false;
    static constexpr int kOffset = 0;
    static KScales scales(const Block& b) { return scales_k4(b); }
    static __m256i chunk(const Block& b, int j) {
        return bits_of(load256(b.qs + 32 * (j / 2)), 4 * (j % 2), 4);
    }
};

struct KQ5 {
    using Block = BlockQ5_K;
    static constexpr bool kHasMin = true, kSigned = false;
    static constexpr int kOffset = 0;
    static KScales scales(const Block& b) { return scales_k4(b); }
    static __m256i chunk(const Block& b, int j) {
        const __m256i lo = bits_of(load256(b.qs + 32 * (j / 2)), 4 * (j % 2), 4);
        return _mm256_or_si256(lo, _mm256_slli_epi16(bits_of(load256(b.qh), j, 1), 4));
    }
};

struct KQ6 {
    using Block = BlockQ6_K;
    static constexpr bool kHasMin = false, kSigned = false;
    static constexpr int kOffset = 32;
    static KScales scales(const Block& b) {
        return {_mm256_cvtepi8_epi16(load128(b.scales)), _mm256_setzero_si256(), half_to_float(b.d),
                0.0f};
    }
    static __m256i chunk(const Block& b, int j) {
        const int h = j / 4, k = j % 4;
        const __m256i lo = bits_of(load256(b.ql + 64 * h + 32 * (k % 2)), 4 * (k / 2), 4);
        const __m256i hi = bits_of(load256(b.qh + 32 * h), 2 * k, 2);
        return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
    }
};

// IQ4_NL's 16 values in both 128-bit lanes, for a byte shuffle.
inline __m256i iq4_table() {
    return _mm256_broadcastsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4Values)));
}

struct KIQ4XS {
    using Block = BlockIQ4_XS;
    static constexpr bool kHasMin = false, kSigned = true;
    static constexpr int kOffset = 0;
    static KScales scales(const Block& b) {
        alignas(16) int8_t sc[16] = {};
        for (int j = 0; j < 8; ++j) sc[j] = static_cast<int8_t>(scale_iq4_xs(j, b));
        const __m128i v = load128(sc);
        return {_mm256_cvtepi8_epi16(_mm_unpacklo_epi8(v, v)), _mm256_setzero_si256(),
                half_to_float(b.d), 0.0f};
    }
    static __m256i chunk(const Block& b, int j) {
        return _mm256_shuffle_epi8(iq4_table(), unpack_nibbles(b.qs + 16 * j));
    }
};

// Chunk j's scales as 16 int16: word 2j of sc in the low 128-bit lane (the chunk's first 16
// values), word 2j + 1 in the high one.
inline __m256i chunk_scales(__m256i sc, int j) {
    const __m256i pair = _mm256_permutevar8x32_epi32(sc, _mm256_set1_epi32(j));
    return _mm256_shuffle_epi8(
        pair, _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2,
                               3, 2, 3, 2, 3, 2, 3, 2, 3));
}

// The 8 lanes whose sum is sum_k v[k] * bsums[k] over a super-block's 16 sums.
inline __m256i bsums_times(__m256i v, const BlockQ8K& a) {
    return _mm256_madd_epi16(v, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.bsums)));
}

// R rows x C tokens of a K-quant (K above) against Q8_K activations.
template <class Isa, class K, int R, int C>
inline void tile_k(const uint8_t* const* wrow, const Activations& a, int64_t t0, int64_t nb,
                   float* y, int64_t ldy, int64_t r0) {
    static_assert(R == 1 || R == 4);
    using Block = typename K::Block;
    // Four rows' sums go through hsum4 and one 4-lane FMA (acc4): lane r rounds as row r's
    // scalar block_fma (acc1) would.
    __m128 acc4[C], macc4[C];
    float acc1[C], macc1[C];
    for (int c = 0; c < C; ++c) {
        acc4[c] = macc4[c] = _mm_setzero_ps();
        acc1[c] = macc1[c] = 0.0f;
    }
    const BlockQ8K* act[C];
    for (int c = 0; c < C; ++c) act[c] = a.qk + (t0 + c) * nb;
    for (int64_t b = 0; b < nb; ++b) {
        if constexpr (C == 1) {
            // The R rows are one contiguous run: prefetch at the rate it is consumed.
            for (size_t o = 0; o < R * sizeof(Block); o += 64)
                prefetch_line(wrow[0] + b * R * sizeof(Block) + o);
        }
        const Block* blk[R];
        KScales s[R];
        for (int r = 0; r < R; ++r) {
            blk[r] = reinterpret_cast<const Block*>(wrow[r]) + b;
            s[r] = K::scales(*blk[r]);
        }
        __m256i isum[R][C];
        for (int r = 0; r < R; ++r) {
            for (int c = 0; c < C; ++c) isum[r][c] = _mm256_setzero_si256();
        }
        for (int j = 0; j < 8; ++j) {
            __m256i av[C];
            for (int c = 0; c < C; ++c) av[c] = load32(act[c][b].qs + 32 * j);
            for (int r = 0; r < R; ++r) {
                const __m256i wv = K::chunk(*blk[r], j);
                const __m256i sc = chunk_scales(s[r].sc, j);
                if constexpr (K::kSigned) {
                    const __m256i wabs = _mm256_sign_epi8(wv, wv);
                    for (int c = 0; c < C; ++c) {
                        isum[r][c] = Isa::dot_u8s8_scaled_add(isum[r][c], wabs,
                                                              _mm256_sign_epi8(av[c], wv), sc);
                    }
                } else {
                    for (int c = 0; c < C; ++c)
                        isum[r][c] = Isa::dot_u8s8_scaled_add(isum[r][c], wv, av[c], sc);
                }
            }
        }
        for (int c = 0; c < C; ++c) {
            const BlockQ8K& ab = act[c][b];
            __m256i mins[R];
            for (int r = 0; r < R; ++r) {
                if constexpr (K::kOffset != 0) {
                    // kOffset * sum_k sc[k] * bsums[k], a power of two: a shift.
                    constexpr int kShift = K::kOffset == 32 ? 5 : 2;
                    static_assert((1 << kShift) == K::kOffset);
                    isum[r][c] = _mm256_sub_epi32(
                        isum[r][c], _mm256_slli_epi32(bsums_times(s[r].sc, ab), kShift));
                }
                if constexpr (K::kHasMin) mins[r] = bsums_times(s[r].m, ab);
            }
            if constexpr (R == 4) {
                const __m128 d =
                    _mm_mul_ps(_mm_setr_ps(s[0].d, s[1].d, s[2].d, s[3].d), _mm_set1_ps(ab.d));
                acc4[c] = block_fma(hsum4_epi32(isum[0][c], isum[1][c], isum[2][c], isum[3][c]), d,
                                    acc4[c]);
                if constexpr (K::kHasMin) {
                    const __m128 dm = _mm_mul_ps(
                        _mm_setr_ps(s[0].dmin, s[1].dmin, s[2].dmin, s[3].dmin), _mm_set1_ps(ab.d));
                    macc4[c] =
                        block_fma(hsum4_epi32(mins[0], mins[1], mins[2], mins[3]), dm, macc4[c]);
                }
            } else {
                acc1[c] = block_fma(hsum_epi32(isum[0][c]), s[0].d * ab.d, acc1[c]);
                if constexpr (K::kHasMin)
                    macc1[c] = block_fma(hsum_epi32(mins[0]), s[0].dmin * ab.d, macc1[c]);
            }
        }
    }
    for (int c = 0; c < C; ++c) {
        if constexpr (R == 4) {
            alignas(16) float out[4];
            _mm_store_ps(out, _mm_sub_ps(acc4[c], macc4[c]));
            for (int r = 0; r < 4; ++r) y[(t0 + c) * ldy + r0 + r] = out[r];
        } else {
            y[(t0 + c) * ldy + r0] = acc1[c] - macc1[c];
        }
    }
}

// run_tiles with the loops the other way round: R rows at a time, every token passing over
// them (C at a time) before the next rows, so a batch reads each weight from memory once
// while the rows' few KiB stay in L1 (the repacked layouts' order, for row-major weights).
// Each output is computed as run_tiles computes it: the same bits.
template <int R, int C, template <int, int> class Tile>
void run_tiles_by_rows(const WeightMatrix& w, const Activations& a, int64_t inner, float* y,
                       int64_t ldy, int64_t r0, int64_t r1) {
    const int64_t n_tok = a.n_tokens;
    const uint8_t* base = static_cast<const uint8_t*>(w.data);
    const size_t stride = w.row_stride();
    for (int64_t r = r0; r < r1;) {
        const int rows = r1 - r >= R ? R : 1;
        const uint8_t* wrow[R];
        for (int i = 0; i < rows; ++i) wrow[i] = base + static_cast<size_t>(r + i) * stride;
        int64_t t = 0;
        if (rows == R) {
            for (; t + C <= n_tok; t += C) Tile<R, C>::run(wrow, a, t, inner, y, ldy, r);
            for (; t < n_tok; ++t) Tile<R, 1>::run(wrow, a, t, inner, y, ldy, r);
        } else {
            for (; t + C <= n_tok; t += C) Tile<1, C>::run(wrow, a, t, inner, y, ldy, r);
            for (; t < n_tok; ++t) Tile<1, 1>::run(wrow, a, t, inner, y, ldy, r);
        }
        r += rows;
    }
}

}  // namespace
}  // namespace deltaserve::kernels
