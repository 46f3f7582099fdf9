// The matmul kernels in llama.cpp's summation order (DotOrder::kGgml): each row keeps one
// fp32 accumulator per 4-element group of a block (8 per row and token), adds each block's
// 8 partial sums converted one by one, and sums the 8 lanes at the end in hsum()'s order, as
// ggml's vec_dot does. With --attention ggml the logits are then llama.cpp's to the bit
// (tests/model/smollm2_golden_test.cpp). The default order (block_fma) takes one conversion
// and FMA per block and row where these take 8. Part of matmul_kernels.h (internal linkage,
// one instantiation per ISA); it uses that header's and matmul_interleaved.h's helpers.
#pragma once

namespace deltaserve::kernels {
namespace {

template <class Isa, bool kHasMin>
inline void gemv4_q4_ggml(const uint8_t* const* wrow, const BlockQ8A* act, int64_t nb,
                          float* out4) {
    using Block = std::conditional_t<kHasMin, BlockQ4_1, BlockQ4_0>;
    const Block* w0 = reinterpret_cast<const Block*>(wrow[0]);
    const Block* w1 = reinterpret_cast<const Block*>(wrow[1]);
    const Block* w2 = reinterpret_cast<const Block*>(wrow[2]);
    const Block* w3 = reinterpret_cast<const Block*>(wrow[3]);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    __m128 macc = _mm_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const BlockQ8A& ab = act[b];
        // The four rows are one contiguous run and the next rows follow it: prefetch at the
        // rate the run is consumed (4 blocks per step), kPrefetchAhead bytes in front.
        prefetch_run(wrow[0], b * 4 * sizeof(Block));
        __m128i h;
        if constexpr (kHasMin) {
            h = _mm_setr_epi16(static_cast<int16_t>(w0[b].d), static_cast<int16_t>(w1[b].d),
                               static_cast<int16_t>(w2[b].d), static_cast<int16_t>(w3[b].d),
                               static_cast<int16_t>(w0[b].m), static_cast<int16_t>(w1[b].m),
                               static_cast<int16_t>(w2[b].m), static_cast<int16_t>(w3[b].m));
        } else {
            h = _mm_setr_epi16(static_cast<int16_t>(w0[b].d), static_cast<int16_t>(w1[b].d),
                               static_cast<int16_t>(w2[b].d), static_cast<int16_t>(w3[b].d), 0, 0,
                               0, 0);
        }
        const __m256 dm = _mm256_cvtph_ps(h);
        const __m128 d4 = _mm256_castps256_ps128(dm);
        const __m128 m4 =
            kHasMin ? _mm256_extractf128_ps(dm, 1) : _mm_mul_ps(d4, _mm_set1_ps(-8.0f));
        macc = _mm_fmadd_ps(m4, _mm_set1_ps(ab.s), macc);
        const __m128 s4 = _mm_mul_ps(d4, _mm_set1_ps(ab.d));
        const __m256i aq = load32(ab.qs);
        const __m256 p0 = _mm256_cvtepi32_ps(Isa::dot_u8s8(unpack_nibbles(w0[b].qs), aq));
        const __m256 p1 = _mm256_cvtepi32_ps(Isa::dot_u8s8(unpack_nibbles(w1[b].qs), aq));
        const __m256 p2 = _mm256_cvtepi32_ps(Isa::dot_u8s8(unpack_nibbles(w2[b].qs), aq));
        const __m256 p3 = _mm256_cvtepi32_ps(Isa::dot_u8s8(unpack_nibbles(w3[b].qs), aq));
        acc[0] = _mm256_fmadd_ps(p0, _mm256_broadcastss_ps(s4), acc[0]);
        acc[1] = _mm256_fmadd_ps(p1, _mm256_broadcastss_ps(_mm_permute_ps(s4, 1)), acc[1]);
        acc[2] = _mm256_fmadd_ps(p2, _mm256_broadcastss_ps(_mm_permute_ps(s4, 2)), acc[2]);
        acc[3] = _mm256_fmadd_ps(p3, _mm256_broadcastss_ps(_mm_permute_ps(s4, 3)), acc[3]);
    }
    alignas(16) float m[4];
    _mm_store_ps(m, macc);
    for (int r = 0; r < 4; ++r) out4[r] = hsum(acc[r]) + m[r];
}

// Q4_0 and Q4_1 against int8 activations: sum = d_w * d_a * sum(nib * q) + m_w * s_a,
// with m_w = -8 d_w for Q4_0.
template <class Isa, bool kHasMin, int R, int C>
inline void tile_q4_ggml(const uint8_t* const* wrow, const Activations& a, int64_t t0, int64_t nb,
                         float* y, int64_t ldy, int64_t r0) {
    using Block = std::conditional_t<kHasMin, BlockQ4_1, BlockQ4_0>;
    if constexpr (R == 4 && C == 1) {
        float out4[4];
        gemv4_q4_ggml<Isa, kHasMin>(wrow, a.q + t0 * nb, nb, out4);
        for (int r = 0; r < 4; ++r) y[t0 * ldy + r0 + r] = out4[r];
        return;
    }
    __m256 acc[R][C];
    float macc[R][C];
    for (int r = 0; r < R; ++r) {
        for (int c = 0; c < C; ++c) {
            acc[r][c] = _mm256_setzero_ps();
            macc[r][c] = 0.0f;
        }
    }
    const BlockQ8A* act[C];
    for (int c = 0; c < C; ++c) act[c] = a.q + (t0 + c) * nb;
    for (int64_t b = 0; b < nb; ++b) {
        __m256i wq[R];
        float wd[R], wm[R];
        for (int r = 0; r < R; ++r) {
            const Block& blk = reinterpret_cast<const Block*>(wrow[r])[b];
            wq[r] = unpack_nibbles(blk.qs);
            wd[r] = half_to_float(blk.d);
            if constexpr (kHasMin) {
                wm[r] = half_to_float(blk.m);
            } else {
                wm[r] = -8.0f * wd[r];
            }
        }
        for (int c = 0; c < C; ++c) {
            const BlockQ8A& ab = act[c][b];
            const __m256i aq = load32(ab.qs);
            for (int r = 0; r < R; ++r) {
                const __m256 p = _mm256_cvtepi32_ps(Isa::dot_u8s8(wq[r], aq));
                acc[r][c] = _mm256_fmadd_ps(p, _mm256_set1_ps(wd[r] * ab.d), acc[r][c]);
                macc[r][c] += wm[r] * ab.s;
            }
        }
    }
    for (int r = 0; r < R; ++r) {
        for (int c = 0; c < C; ++c) y[(t0 + c) * ldy + r0 + r] = hsum(acc[r][c]) + macc[r][c];
    }
}

// Q8_0 against int8 activations (signed x signed through the sign trick).
template <class Isa, int R, int C>
inline void tile_q8_0_ggml(const uint8_t* const* wrow, const Activations& a, int64_t t0, int64_t nb,
                           float* y, int64_t ldy, int64_t r0) {
    __m256 acc[R][C];
    for (int r = 0; r < R; ++r) {
        for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
    }
    const BlockQ8A* act[C];
    for (int c = 0; c < C; ++c) act[c] = a.q + (t0 + c) * nb;
    for (int64_t b = 0; b < nb; ++b) {
        if constexpr (C == 1) prefetch_run(wrow[0], b * R * sizeof(BlockQ8_0));
        __m256i wabs[R], wq[R];
        float wd[R];
        for (int r = 0; r < R; ++r) {
            const BlockQ8_0& blk = reinterpret_cast<const BlockQ8_0*>(wrow[r])[b];
            wq[r] = load32(blk.qs);
            wabs[r] = _mm256_sign_epi8(wq[r], wq[r]);
            wd[r] = half_to_float(blk.d);
        }
        for (int c = 0; c < C; ++c) {
            const BlockQ8A& ab = act[c][b];
            const __m256i aq = load32(ab.qs);
            for (int r = 0; r < R; ++r) {
                const __m256i sa = _mm256_sign_epi8(aq, wq[r]);
                const __m256 p = _mm256_cvtepi32_ps(Isa::dot_u8s8(wabs[r], sa));
                acc[r][c] = _mm256_fmadd_ps(p, _mm256_set1_ps(wd[r] * ab.d), acc[r][c]);
            }
        }
    }
    for (int r = 0; r < R; ++r) {
        for (int c = 0; c < C; ++c) y[(t0 + c) * ldy + r0 + r] = hsum(acc[r][c]);
    }
}

// The 8 group accumulators of 8 rows, summed lane-wise in the order hsum() sums one row's
// 8 lanes.
inline __m256 sum_groups(const __m256* g) {
    return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(g[0], g[4]), _mm256_add_ps(g[2], g[6])),
                         _mm256_add_ps(_mm256_add_ps(g[1], g[5]), _mm256_add_ps(g[3], g[7])));
}

// Q4_0 / Q4_1: 8 rows (from r0) x C tokens (from t0).
template <class Isa, bool kHasMin, int C>
inline void x8_q4_ggml(const uint8_t* group, const Activations& a, int64_t t0, int64_t nb, float* y,
                       int64_t ldy, int64_t r0) {
    using Block = std::conditional_t<kHasMin, BlockQ4_1x8, BlockQ4_0x8>;
    const Block* w = reinterpret_cast<const Block*>(group);
    __m256 acc[C][8], macc[C];
    const BlockQ8A* act[C];
    for (int c = 0; c < C; ++c) {
        for (int j = 0; j < 8; ++j) acc[c][j] = _mm256_setzero_ps();
        macc[c] = _mm256_setzero_ps();
        act[c] = a.q + (t0 + c) * nb;
    }
    const __m256i mask = _mm256_set1_epi8(0x0F);
    for (int64_t b = 0; b < nb; ++b) {
        prefetch_block<sizeof(Block)>(group, b * sizeof(Block));
        const Block& blk = w[b];
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.d)));
        __m256 m;
        if constexpr (kHasMin) {
            m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.m)));
        } else {
            m = _mm256_mul_ps(d, _mm256_set1_ps(-8.0f));
        }
        __m256 s[C];
        for (int c = 0; c < C; ++c) {
            s[c] = _mm256_mul_ps(d, _mm256_set1_ps(act[c][b].d));
            macc[c] = _mm256_fmadd_ps(m, _mm256_set1_ps(act[c][b].s), macc[c]);
        }
        for (int j = 0; j < 4; ++j) {
            const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs[j]));
            const __m256i lo = _mm256_and_si256(raw, mask);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
            for (int c = 0; c < C; ++c) {
                const int8_t* q = act[c][b].qs;
                const __m256 plo = _mm256_cvtepi32_ps(Isa::dot_u8s8(lo, broadcast4(q + 4 * j)));
                const __m256 phi =
                    _mm256_cvtepi32_ps(Isa::dot_u8s8(hi, broadcast4(q + 16 + 4 * j)));
                acc[c][j] = _mm256_fmadd_ps(plo, s[c], acc[c][j]);
                acc[c][j + 4] = _mm256_fmadd_ps(phi, s[c], acc[c][j + 4]);
            }
        }
    }
    for (int c = 0; c < C; ++c) {
        _mm256_storeu_ps(y + (t0 + c) * ldy + r0, _mm256_add_ps(sum_groups(acc[c]), macc[c]));
    }
}

// Q8_0 (signed x signed through the sign trick, as tile_q8_0).
template <class Isa, int C>
inline void x8_q8_0_ggml(const uint8_t* group, const Activations& a, int64_t t0, int64_t nb,
                         float* y, int64_t ldy, int64_t r0) {
    const BlockQ8_0x8* w = reinterpret_cast<const BlockQ8_0x8*>(group);
    __m256 acc[C][8];
    const BlockQ8A* act[C];
    for (int c = 0; c < C; ++c) {
        for (int j = 0; j < 8; ++j) acc[c][j] = _mm256_setzero_ps();
        act[c] = a.q + (t0 + c) * nb;
    }
    for (int64_t b = 0; b < nb; ++b) {
        prefetch_block<sizeof(BlockQ8_0x8)>(group, b * sizeof(BlockQ8_0x8));
        const BlockQ8_0x8& blk = w[b];
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.d)));
        __m256 s[C];
        for (int c = 0; c < C; ++c) s[c] = _mm256_mul_ps(d, _mm256_set1_ps(act[c][b].d));
        for (int j = 0; j < 8; ++j) {
            const __m256i wq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs[j]));
            const __m256i wabs = _mm256_sign_epi8(wq, wq);
            for (int c = 0; c < C; ++c) {
                const __m256i sa = _mm256_sign_epi8(broadcast4(act[c][b].qs + 4 * j), wq);
                acc[c][j] =
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(Isa::dot_u8s8(wabs, sa)), s[c], acc[c][j]);
            }
        }
    }
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(y + (t0 + c) * ldy + r0, sum_groups(acc[c]));
}

}  // namespace
}  // namespace deltaserve::kernels
