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

namespace deltaserve::kernels {
namespace {

// A weight super-block's scales as the kernels use them: sc[k] and m[k] apply to values
// 16k .. 16k + 15 (types with 8 sub-blocks repeat each twice), d and dmin as fp32.
struct KScales {
    alignas(32) int16_t sc[16];
    alignas(32) int16_t m[16];
    float d, dmin;
};

inline __m256i load256(const uint8_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// The 32-byte chunk's bits [shift, shift + width) of every byte, as bytes.
inline __m256i bits_of(__m256i v, int shift, int width) {
    return _mm256_and_si256(_mm256_srli_epi16(v, shift), _mm256_set1_epi8((1 << width) - 1));
}

// Each type: Block, kHasMin (the minimum term), kOffset (subtracted from every quant, folded
// in through the activations' sums), kSigned (signed quants: the sign trick), scales() and
// chunk(j): values 32j .. 32j + 31 as bytes in element order.
struct KQ2 {
    using Block = BlockQ2_K;
    static constexpr bool kHasMin = true, kSigned = false;
    static constexpr int kOffset = 0;
    static void scales(const Block& b, KScales& s) {
        for (int k = 0; k < 16; ++k) {
            s.sc[k] = static_cast<int16_t>(b.scales[k] & 0xF);
            s.m[k] = static_cast<int16_t>(b.scales[k] >> 4);
        }
        s.d = half_to_float(b.d);
        s.dmin = half_to_float(b.dmin);
    }
    static __m256i chunk(const Block& b, int j) {
        return bits_of(load256(b.qs + 32 * (j / 4)), 2 * (j % 4), 2);
    }
};

struct KQ3 {
    using Block = BlockQ3_K;
    static constexpr bool kHasMin = false, kSigned = false;
    static constexpr int kOffset = 4;  // value = low 2 bits + 4 * high bit - 4
    static void scales(const Block& b, KScales& s) {
        for (int k = 0; k < 16; ++k) s.sc[k] = static_cast<int16_t>(scale_q3_k(k, b.scales));
        s.d = half_to_float(b.d);
    }
    static __m256i chunk(const Block& b, int j) {
        const __m256i lo = bits_of(load256(b.qs + 32 * (j / 4)), 2 * (j % 4), 2);
        const __m256i hi = bits_of(load256(b.hmask), j, 1);
        return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 2));
    }
};

// Q4_K and Q5_K's 8 scales and minimums of 6 bits.
template <class Block>
inline void scales_k4(const Block& b, KScales& s) {
    for (int j = 0; j < 8; ++j) {
        int sc, m;
        scale_min_k4(j, b.scales, &sc, &m);
        s.sc[2 * j] = s.sc[2 * j + 1] = static_cast<int16_t>(sc);
        s.m[2 * j] = s.m[2 * j + 1] = static_cast<int16_t>(m);
    }
    s.d = half_to_float(b.d);
    s.dmin = half_to_float(b.dmin);
}

struct KQ4 {
    using Block = BlockQ4_K;
    static constexpr bool kHasMin = true, kSigned = false;
    static constexpr int kOffset = 0;
    static void scales(const Block& b, KScales& s) { scales_k4(b, s); }
    static __m256i chunk(const Block& b, int j) {
        return bits_of(load256(b.qs + 32 * (j / 2)), 4 * (j % 2), 4);
    }
};

struct KQ5 {
    using Block = BlockQ5_K;
    static constexpr bool kHasMin = true, kSigned = false;
    static constexpr int kOffset = 0;
    static void scales(const Block& b, KScales& s) { scales_k4(b, s); }
    static __m256i chunk(const Block& b, int j) {
        const __m256i lo = bits_of(load256(b.qs + 32 * (j / 2)), 4 * (j % 2), 4);
        return _mm256_or_si256(lo, _mm256_slli_epi16(bits_of(load256(b.qh), j, 1), 4));
    }
};

struct KQ6 {
    using Block = BlockQ6_K;
    static constexpr bool kHasMin = false, kSigned = false;
    static constexpr int kOffset = 32;
    static void scales(const Block& b, KScales& s) {
        for (int k = 0; k < 16; ++k) s.sc[k] = b.scales[k];
        s.d = half_to_float(b.d);
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
    static void scales(const Block& b, KScales& s) {
        for (int j = 0; j < 8; ++j)
            s.sc[2 * j] = s.sc[2 * j + 1] = static_cast<int16_t>(scale_iq4_xs(j, b));
        s.d = half_to_float(b.d);
    }
    static __m256i chunk(const Block& b, int j) {
        return _mm256_shuffle_epi8(iq4_table(), unpack_nibbles(b.qs + 16 * j));
    }
};

// Chunk j's scales: sc[2j] for its first 16 values (the low 128-bit lane), sc[2j + 1] for
// the rest.
inline __m256i chunk_scales(const KScales& s, int j) {
    return _mm256_set_m128i(_mm_set1_epi16(s.sc[2 * j + 1]), _mm_set1_epi16(s.sc[2 * j]));
}

// sum_k v[k] * bsums[k] over a super-block's 16 sums.
inline int32_t dot_bsums(const int16_t* v, const int16_t* bsums) {
    const __m256i a = _mm256_load_si256(reinterpret_cast<const __m256i*>(v));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bsums));
    return hsum_epi32(_mm256_madd_epi16(a, b));
}

// R rows x C tokens of a K-quant (K above) against Q8_K activations.
template <class Isa, class K, int R, int C>
inline void tile_k(const uint8_t* const* wrow, const Activations& a, int64_t t0, int64_t nb,
                   float* y, int64_t ldy, int64_t r0) {
    using Block = typename K::Block;
    float acc[R][C], macc[R][C];
    for (int r = 0; r < R; ++r) {
        for (int c = 0; c < C; ++c) acc[r][c] = macc[r][c] = 0.0f;
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
            K::scales(*blk[r], s[r]);
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
                const __m256i sc = chunk_scales(s[r], j);
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
        for (int r = 0; r < R; ++r) {
            for (int c = 0; c < C; ++c) {
                const BlockQ8K& ab = act[c][b];
                int32_t total = hsum_epi32(isum[r][c]);
                if constexpr (K::kOffset != 0) total -= K::kOffset * dot_bsums(s[r].sc, ab.bsums);
                acc[r][c] = block_fma(total, s[r].d * ab.d, acc[r][c]);
                if constexpr (K::kHasMin) {
                    macc[r][c] =
                        block_fma(dot_bsums(s[r].m, ab.bsums), s[r].dmin * ab.d, macc[r][c]);
                }
            }
        }
    }
    for (int r = 0; r < R; ++r) {
        for (int c = 0; c < C; ++c) y[(t0 + c) * ldy + r0 + r] = acc[r][c] - macc[r][c];
    }
}

}  // namespace
}  // namespace deltaserve::kernels
