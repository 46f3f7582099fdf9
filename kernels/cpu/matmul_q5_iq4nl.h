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
    using Block = typename B::Block;
    float acc[R][C], macc[R][C];
    for (int r = 0; r < R; ++r) {
        for (int c = 0; c < C; ++c) acc[r][c] = macc[r][c] = 0.0f;
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
            for (int r = 0; r < R; ++r) {
                const __m256i sum = B::kSigned ? Isa::dot_u8s8(wabs[r], _mm256_sign_epi8(aq, wq[r]))
                                               : Isa::dot_u8s8(wq[r], aq);
                acc[r][c] = block_fma(hsum_epi32(sum), wd[r] * ab.d, acc[r][c]);
                if constexpr (B::kHasOffset) macc[r][c] = std::fma(wm[r], ab.s, macc[r][c]);
            }
        }
    }
    for (int r = 0; r < R; ++r) {
        for (int c = 0; c < C; ++c) y[(t0 + c) * ldy + r0 + r] = acc[r][c] + macc[r][c];
    }
}

}  // namespace
}  // namespace deltaserve::kernels
