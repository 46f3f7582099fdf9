// Matmul micro-kernels of Q5_0, Q5_1 and IQ4_NL against the 32-value int8 activations
// (BlockQ8A), in the order of tile_q4 / tile_q8_0: each block's products in one exact int32,
// one conversion and one FMA per block (block_fma), the minimum term (Q5_0's -16 d, Q5_1's m)
// in its own accumulator. Part of matmul_kernels.h (internal linkage, one instantiation per
// ISA); it uses that header's and matmul_kquants.h's helpers.
#pragma once

#include <cstring>

namespace deltaserve::kernels {
namespace {

// 32 bits -> 32 bytes, byte j 0xFF where bit j is set (ggml's bytes_from_bits_32).
inline __m256i bytes_from_bits(const uint8_t* p) {
    uint32_t bits;
    std::memcpy(&bits, p, 4);
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(static_cast<int>(bits)),
        _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
    const __m256i others = _mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(others, _mm256_set1_epi64x(-1));
}

// Each type: Block, kSigned, kHasOffset and quants() (32 values as bytes, element order);
// offset(): the per-value term times the activations' sum s.
template <bool kHasMin>
struct BQ5 {
    using Block = std::conditional_t<kHasMin, BlockQ5_1, BlockQ5_0>;
    static constexpr bool kSigned = false, kHasOffset = true;
    static __m256i quants(const Block& b) {
        const __m256i high = _mm256_and_si256(bytes_from_bits(b.qh), _mm256_set1_epi8(0x10));
        return _mm256_or_si256(unpack_nibbles(b.qs), high);
    }
    static float offset(const Block& b, float d) {
        if constexpr (kHasMin) {
            return half_to_float(b.m);
        } else {
            return -16.0f * d;
        }
    }
};

struct BIQ4NL {
    using Block = BlockIQ4_NL;
    static constexpr bool kSigned = true, kHasOffset = false;
    static __m256i quants(const Block& b) {
        return _mm256_shuffle_epi8(iq4_table(), unpack_nibbles(b.qs));
    }
    static float offset(const Block&, float) { return 0.0f; }
};

template <class Isa, class B, int R, int C>
inline void tile_b32(const uint8_t* const* wrow, const Activations& a, int64_t t0, int64_t nb,
                     float* y, int64_t ldy, int64_t r0) {
    static_assert(R == 1 || R == 4);
    using Block = typename B::Block;
    // Four rows' block sums go through hsum4 and 4-lane FMAs (acc4): lane r rounds as row r's
    // scalar block_fma and fma (acc1) would.
    __m128 acc4[C], macc4[C];
    float acc1[C], macc1[C];
    for (int c = 0; c < C; ++c) {
        acc4[c] = macc4[c] = _mm_setzero_ps();
        acc1[c] = macc1[c] = 0.0f;
    }
    const BlockQ8A* act[C];
    for (int c = 0; c < C; ++c) act[c] = a.q + (t0 + c) * nb;
    for (int64_t b = 0; b < nb; ++b) {
        if constexpr (C == 1) prefetch_run(wrow[0], b * R * sizeof(Block));
        __m256i wq[R], wabs[R];
        float wd[R], wm[R];
        for (int r = 0; r < R; ++r) {
            const Block& blk = reinterpret_cast<const Block*>(wrow[r])[b];
            wq[r] = B::quants(blk);
            if constexpr (B::kSigned) wabs[r] = _mm256_sign_epi8(wq[r], wq[r]);
            wd[r] = half_to_float(blk.d);
            wm[r] = B::offset(blk, wd[r]);
        }
        for (int c = 0; c < C; ++c) {
            const BlockQ8A& ab = act[c][b];
            const __m256i aq = load32(ab.qs);
            __m256i sum[R];
            for (int r = 0; r < R; ++r) {
                sum[r] = B::kSigned ? Isa::dot_u8s8(wabs[r], _mm256_sign_epi8(aq, wq[r]))
                                    : Isa::dot_u8s8(wq[r], aq);
            }
            if constexpr (R == 4) {
                const __m128 d =
                    _mm_mul_ps(_mm_setr_ps(wd[0], wd[1], wd[2], wd[3]), _mm_set1_ps(ab.d));
                acc4[c] = block_fma(hsum4_epi32(sum[0], sum[1], sum[2], sum[3]), d, acc4[c]);
                if constexpr (B::kHasOffset) {
                    macc4[c] = _mm_fmadd_ps(_mm_setr_ps(wm[0], wm[1], wm[2], wm[3]),
                                            _mm_set1_ps(ab.s), macc4[c]);
                }
            } else {
                acc1[c] = block_fma(hsum_epi32(sum[0]), wd[0] * ab.d, acc1[c]);
                if constexpr (B::kHasOffset) macc1[c] = std::fma(wm[0], ab.s, macc1[c]);
            }
        }
    }
    for (int c = 0; c < C; ++c) {
        if constexpr (R == 4) {
            alignas(16) float out[4];
            _mm_store_ps(out, _mm_add_ps(acc4[c], macc4[c]));
            for (int r = 0; r < 4; ++r) y[(t0 + c) * ldy + r0 + r] = out[r];
        } else {
            y[(t0 + c) * ldy + r0] = acc1[c] + macc1[c];
        }
    }
}

}  // namespace
}  // namespace deltaserve::kernels
