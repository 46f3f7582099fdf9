// Matmul micro-kernels, written once as templates over the instruction set's int8 dot
// product and instantiated in one translation unit per ISA (matmul_avx2.cpp,
// avx512/matmul_avx512.cpp). Everything here has internal linkage on purpose: the same
// code compiled with different -m flags must not be merged by the linker.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "blocks.h"
#include "deltaserve/kernels/dtype.h"
#include "matmul_table.h"

namespace deltaserve::kernels {
namespace {

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

// Every quantized kernel sums a row's products over one block of 32 in int32, exactly
// (|sum| < 2^20, so its conversion is exact too), then adds the block to the row's one fp32
// accumulator with one FMA, block after block in order: block_fma. Whatever the layout, the
// tile or the instruction set, a row's output has the same bits. (llama.cpp's vec_dot
// keeps 8 fp32 lanes per row and converts each block's 8 partial sums: 8 conversions and
// FMAs per block and row where this takes one.)
inline __m256 block_fma(__m256i sum, __m256 scale, __m256 acc) {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), scale, acc);
}
inline __m128 block_fma(__m128i sum, __m128 scale, __m128 acc) {
    return _mm_fmadd_ps(_mm_cvtepi32_ps(sum), scale, acc);
}
inline float block_fma(int32_t sum, float scale, float acc) {
    return _mm_cvtss_f32(
        _mm_fmadd_ss(_mm_set_ss(static_cast<float>(sum)), _mm_set_ss(scale), _mm_set_ss(acc)));
}

// The sum of 8 int32 lanes.
inline int32_t hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

// The lane sums of four vectors, as lanes 0..3.
inline __m128i hsum4_epi32(__m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

// 16 bytes of packed nibbles -> 32 unsigned bytes in element order (byte j holds element j
// in its low nibble and element j + 16 in its high nibble).
inline __m256i unpack_nibbles(const uint8_t* qs) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(raw, mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
    return _mm256_set_m128i(hi, lo);
}

inline __m256i load32(const int8_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// The decode case of tile_q4 (4 rows, 1 token): the four rows' fp16 scales and mins are
// converted with one instruction and the min terms of all four rows share one FMA, which
// removes most of the scalar work per block.
// Decoding streams every weight once per token; the hardware prefetcher alone leaves the
// 4-row tiles waiting on memory (measured: 72 -> 96 tok/s single-threaded with this).
constexpr int kPrefetchAhead = 4096;

// Prefetches the cache line kPrefetchAhead bytes past p.
inline void prefetch_line(const uint8_t* p) {
    _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetchAhead, _MM_HINT_T0);
}

// Prefetches the two cache lines kPrefetchAhead bytes past `consumed` bytes of a run.
inline void prefetch_run(const uint8_t* run, size_t consumed) {
    prefetch_line(run + consumed);
    prefetch_line(run + consumed + 64);
}

template <class Isa, bool kHasMin>
inline void gemv4_q4(const uint8_t* const* wrow, const BlockQ8A* act, int64_t nb, float* out4) {
    using Block = std::conditional_t<kHasMin, BlockQ4_1, BlockQ4_0>;
    const Block* w0 = reinterpret_cast<const Block*>(wrow[0]);
    const Block* w1 = reinterpret_cast<const Block*>(wrow[1]);
    const Block* w2 = reinterpret_cast<const Block*>(wrow[2]);
    const Block* w3 = reinterpret_cast<const Block*>(wrow[3]);
    __m128 acc = _mm_setzero_ps(), macc = _mm_setzero_ps();
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
        const __m128i sum = hsum4_epi32(Isa::dot_u8s8(unpack_nibbles(w0[b].qs), aq),
                                        Isa::dot_u8s8(unpack_nibbles(w1[b].qs), aq),
                                        Isa::dot_u8s8(unpack_nibbles(w2[b].qs), aq),
                                        Isa::dot_u8s8(unpack_nibbles(w3[b].qs), aq));
        acc = block_fma(sum, s4, acc);
    }
    _mm_storeu_ps(out4, _mm_add_ps(acc, macc));
}

// Q4_0 and Q4_1 against int8 activations: sum = d_w * d_a * sum(nib * q) + m_w * s_a,
// with m_w = -8 d_w for Q4_0.
template <class Isa, bool kHasMin, int R, int C>
inline void tile_q4(const uint8_t* const* wrow, const Activations& a, int64_t t0, int64_t nb,
                    float* y, int64_t ldy, int64_t r0) {
    using Block = std::conditional_t<kHasMin, BlockQ4_1, BlockQ4_0>;
    if constexpr (R == 4 && C == 1) {
        float out4[4];
        gemv4_q4<Isa, kHasMin>(wrow, a.q + t0 * nb, nb, out4);
        for (int r = 0; r < 4; ++r) y[t0 * ldy + r0 + r] = out4[r];
        return;
    }
    float acc[R][C], macc[R][C];
    for (int r = 0; r < R; ++r) {
        for (int c = 0; c < C; ++c) acc[r][c] = macc[r][c] = 0.0f;
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
                acc[r][c] =
                    block_fma(hsum_epi32(Isa::dot_u8s8(wq[r], aq)), wd[r] * ab.d, acc[r][c]);
                macc[r][c] = std::fma(wm[r], ab.s, macc[r][c]);
            }
        }
    }
    for (int r = 0; r < R; ++r) {
        for (int c = 0; c < C; ++c) y[(t0 + c) * ldy + r0 + r] = acc[r][c] + macc[r][c];
    }
}

// Q8_0 against int8 activations (signed x signed through the sign trick).
template <class Isa, int R, int C>
inline void tile_q8_0(const uint8_t* const* wrow, const Activations& a, int64_t t0, int64_t nb,
                      float* y, int64_t ldy, int64_t r0) {
    float acc[R][C];
    for (int r = 0; r < R; ++r) {
        for (int c = 0; c < C; ++c) acc[r][c] = 0.0f;
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
                acc[r][c] =
                    block_fma(hsum_epi32(Isa::dot_u8s8(wabs[r], sa)), wd[r] * ab.d, acc[r][c]);
            }
        }
    }
    for (int r = 0; r < R; ++r) {
        for (int c = 0; c < C; ++c) y[(t0 + c) * ldy + r0 + r] = acc[r][c];
    }
}

// Loads 8 weights of a float-typed row as fp32.
template <DType T>
inline __m256 load8(const uint8_t* row, int64_t k) {
    if constexpr (T == DType::kF32) {
        return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + k);
    } else if constexpr (T == DType::kF16) {
        return _mm256_cvtph_ps(_mm_loadu_si128(
            reinterpret_cast<const __m128i*>(reinterpret_cast<const uint16_t*>(row) + k)));
    } else {
        const __m128i h = _mm_loadu_si128(
            reinterpret_cast<const __m128i*>(reinterpret_cast<const uint16_t*>(row) + k));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
}

// One weight of a float-typed row (remainders of rows not a multiple of 8).
template <DType T>
inline float load1(const uint8_t* row, int64_t k) {
    if constexpr (T == DType::kF32) {
        return reinterpret_cast<const float*>(row)[k];
    } else if constexpr (T == DType::kF16) {
        return _cvtsh_ss(reinterpret_cast<const uint16_t*>(row)[k]);
    } else {
        const uint32_t bits = static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(row)[k])
                              << 16;
        float f;
        __builtin_memcpy(&f, &bits, 4);
        return f;
    }
}

template <DType T, int R, int C>
inline void tile_float(const uint8_t* const* wrow, const Activations& a, int64_t t0, int64_t n,
                       float* y, int64_t ldy, int64_t r0) {
    __m256 acc[R][C];
    for (int r = 0; r < R; ++r) {
        for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
    }
    const int64_t n8 = n - n % 8;
    for (int64_t k = 0; k < n8; k += 8) {
        __m256 w[R];
        for (int r = 0; r < R; ++r) w[r] = load8<T>(wrow[r], k);
        for (int c = 0; c < C; ++c) {
            const __m256 x = _mm256_loadu_ps(a.x + (t0 + c) * a.ldx + k);
            for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(w[r], x, acc[r][c]);
        }
    }
    for (int r = 0; r < R; ++r) {
        for (int c = 0; c < C; ++c) {
            float sum = hsum(acc[r][c]);
            const float* x = a.x + (t0 + c) * a.ldx;
            for (int64_t k = n8; k < n; ++k) sum += load1<T>(wrow[r], k) * x[k];
            y[(t0 + c) * ldy + r0 + r] = sum;
        }
    }
}

// Runs a tile function over rows [r0, r1) x all tokens: tiles of R rows x C tokens, with
// narrower tiles for the remainders.
template <int R, int C, template <int, int> class Tile>
void run_tiles(const WeightMatrix& w, const Activations& a, int64_t inner, float* y, int64_t ldy,
               int64_t r0, int64_t r1) {
    const int64_t n_tok = a.n_tokens;
    const uint8_t* base = static_cast<const uint8_t*>(w.data);
    const size_t stride = w.row_stride();  // once: it is a table lookup
    auto row = [&](int64_t r) { return base + static_cast<size_t>(r) * stride; };
    for (int64_t t = 0; t < n_tok;) {
        const bool full_c = n_tok - t >= C;
        for (int64_t r = r0; r < r1;) {
            const uint8_t* rows[R];
            if (r1 - r >= R) {
                for (int i = 0; i < R; ++i) rows[i] = row(r + i);
                if (full_c) {
                    Tile<R, C>::run(rows, a, t, inner, y, ldy, r);
                } else {
                    for (int64_t tt = t; tt < n_tok; ++tt)
                        Tile<R, 1>::run(rows, a, tt, inner, y, ldy, r);
                }
                r += R;
            } else {
                rows[0] = row(r);
                if (full_c) {
                    Tile<1, C>::run(rows, a, t, inner, y, ldy, r);
                } else {
                    for (int64_t tt = t; tt < n_tok; ++tt)
                        Tile<1, 1>::run(rows, a, tt, inner, y, ldy, r);
                }
                r += 1;
            }
        }
        t += full_c ? C : n_tok - t;
    }
}

}  // namespace
}  // namespace deltaserve::kernels

#include "matmul_interleaved.h"
// After it: they use its helpers.
#include "matmul_ggml_order.h"
#include "matmul_interleaved_k.h"
#include "matmul_kquants.h"
#include "matmul_q5_iq4nl.h"

// Last: the table of all the kernels above.
#include "matmul_isa_kernels.h"
