// Matmul micro-kernels over interleaved weights (repack.h, blocks.h's x8 blocks): one
// 256-bit register holds the same 4 quants of 8 rows, so one integer product with a
// broadcast activation word gives 4-element partial sums of 8 rows at once, and the rows'
// scales come as one vector. A block's integer sum is exact, so each row takes one
// conversion and one FMA per block (block_fma's order: the same bits as the row-major
// kernels of matmul_kernels.h). Part of matmul_kernels.h (internal linkage, one
// instantiation per ISA); it uses that header's helpers.
#pragma once

#include <cstring>

namespace deltaserve::kernels {
namespace {

// Four activation bytes in every 32-bit lane.
inline __m256i broadcast4(const int8_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

// Prefetches the lines of one interleaved block kPrefetchAhead bytes ahead: a row group's
// blocks are one contiguous run and the next group follows it.
template <size_t kBytes>
inline void prefetch_block(const uint8_t* run, size_t consumed) {
    for (size_t o = 0; o < kBytes; o += 64) prefetch_line(run + consumed + o);
}

// Q4_0 / Q4_1: 8 rows (from r0) x C tokens (from t0).
template <class Isa, bool kHasMin, int C>
inline void x8_q4(const uint8_t* group, const Activations& a, int64_t t0, int64_t nb, float* y,
                  int64_t ldy, int64_t r0) {
    using Block = std::conditional_t<kHasMin, BlockQ4_1x8, BlockQ4_0x8>;
    const Block* w = reinterpret_cast<const Block*>(group);
    __m256 acc[C], macc[C];
    const BlockQ8A* act[C];
    for (int c = 0; c < C; ++c) {
        acc[c] = _mm256_setzero_ps();
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
        __m256i sum[C];
        for (int c = 0; c < C; ++c) {
            sum[c] = _mm256_setzero_si256();
            macc[c] = _mm256_fmadd_ps(m, _mm256_set1_ps(act[c][b].s), macc[c]);
        }
        for (int j = 0; j < 4; ++j) {
            const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs[j]));
            const __m256i lo = _mm256_and_si256(raw, mask);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
            for (int c = 0; c < C; ++c) {
                const int8_t* q = act[c][b].qs;
                sum[c] = Isa::dot_u8s8_add(sum[c], lo, broadcast4(q + 4 * j));
                sum[c] = Isa::dot_u8s8_add(sum[c], hi, broadcast4(q + 16 + 4 * j));
            }
        }
        for (int c = 0; c < C; ++c) {
            const __m256 s = _mm256_mul_ps(d, _mm256_set1_ps(act[c][b].d));
            acc[c] = block_fma(sum[c], s, acc[c]);
        }
    }
    for (int c = 0; c < C; ++c) {
        _mm256_storeu_ps(y + (t0 + c) * ldy + r0, _mm256_add_ps(acc[c], macc[c]));
    }
}

// Q8_0 (signed x signed through the sign trick, as tile_q8_0).
template <class Isa, int C>
inline void x8_q8_0(const uint8_t* group, const Activations& a, int64_t t0, int64_t nb, float* y,
                    int64_t ldy, int64_t r0) {
    const BlockQ8_0x8* w = reinterpret_cast<const BlockQ8_0x8*>(group);
    __m256 acc[C];
    const BlockQ8A* act[C];
    for (int c = 0; c < C; ++c) {
        acc[c] = _mm256_setzero_ps();
        act[c] = a.q + (t0 + c) * nb;
    }
    for (int64_t b = 0; b < nb; ++b) {
        prefetch_block<sizeof(BlockQ8_0x8)>(group, b * sizeof(BlockQ8_0x8));
        const BlockQ8_0x8& blk = w[b];
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.d)));
        __m256i se[C], so[C];  // even and odd 4-element groups apart (two chains)
        for (int c = 0; c < C; ++c) se[c] = so[c] = _mm256_setzero_si256();
        for (int j = 0; j < 8; ++j) {
            const __m256i wq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs[j]));
            const __m256i wabs = _mm256_sign_epi8(wq, wq);
            for (int c = 0; c < C; ++c) {
                const __m256i sa = _mm256_sign_epi8(broadcast4(act[c][b].qs + 4 * j), wq);
                __m256i& sum = j % 2 == 0 ? se[c] : so[c];
                sum = Isa::dot_u8s8_add(sum, wabs, sa);
            }
        }
        for (int c = 0; c < C; ++c) {
            const __m256 s = _mm256_mul_ps(d, _mm256_set1_ps(act[c][b].d));
            acc[c] = block_fma(_mm256_add_epi32(se[c], so[c]), s, acc[c]);
        }
    }
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(y + (t0 + c) * ldy + r0, acc[c]);
}

// Rows [r0, r1) (multiples of 8) x all tokens, C tokens at a time: a row group's blocks stay
// in L1 while every token passes over them.
template <int C, template <int> class Kernel, int kBlockElems = kQK>
void run_interleaved(const WeightMatrix& w, const Activations& a, float* y, int64_t ldy, int64_t r0,
                     int64_t r1) {
    const int64_t nb = w.cols / kBlockElems;
    const size_t group_bytes = w.row_stride() * 8;
    const uint8_t* base = static_cast<const uint8_t*>(w.data);
    for (int64_t r = r0; r < r1; r += 8) {
        const uint8_t* group = base + static_cast<size_t>(r / 8) * group_bytes;
        int64_t t = 0;
        for (; t + C <= a.n_tokens; t += C) Kernel<C>::run(group, a, t, nb, y, ldy, r);
        // The rest in halves (a batch of 2 or 3 reads the group once, not once a token).
        if constexpr (C >= 8) {
            if (t + 4 <= a.n_tokens) Kernel<4>::run(group, a, t, nb, y, ldy, r), t += 4;
        }
        if constexpr (C >= 4) {
            if (t + 2 <= a.n_tokens) Kernel<2>::run(group, a, t, nb, y, ldy, r), t += 2;
        }
        for (; t < a.n_tokens; ++t) Kernel<1>::run(group, a, t, nb, y, ldy, r);
    }
}

}  // namespace
}  // namespace deltaserve::kernels
