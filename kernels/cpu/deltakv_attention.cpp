// latent_attention: a decode step's attention over DeltaKV tokens whose values stay latent.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "deltaserve/common/fp16.h"
#include "deltaserve/common/status.h"
#include "deltaserve/kernels/deltakv.h"
#include "simd_math.h"

namespace deltaserve::kernels {

namespace {

constexpr int kMaxHeads = 64;
constexpr int kMaxKvDim = 2048;
constexpr int64_t kTokenPiece = 64;  // tokens per piece of the weighted latent sums
constexpr int64_t kRefPiece = 256;   // references per piece of the weighted values

constexpr int64_t kPrefetchAhead = 4;  // rows

void prefetch_row(const void* row, int bytes) {
    const char* p = static_cast<const char*>(row);
    for (int b = 0; b < bytes; b += 64) _mm_prefetch(p + b, _MM_HINT_T0);
}

void axpy(float a, const float* x, float* y, int n) {
    const __m256 av = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; ++i) y[i] += a * x[i];
}

// out = sum_i p[i] z_i over n rows of m values, up to 64 columns held in registers per pass.
void weighted_rows(const float* p, const float* z, int64_t n, int m, float* out) {
    int c0 = 0;
    while (c0 + 8 <= m) {
        const int nv = std::min(8, (m - c0) / 8);
        __m256 acc[8];
        for (int v = 0; v < nv; ++v) acc[v] = _mm256_setzero_ps();
        for (int64_t i = 0; i < n; ++i) {
            const __m256 pi = _mm256_set1_ps(p[i]);
            const float* zi = z + i * m + c0;
            for (int v = 0; v < nv; ++v)
                acc[v] = _mm256_fmadd_ps(pi, _mm256_loadu_ps(zi + 8 * v), acc[v]);
        }
        for (int v = 0; v < nv; ++v) _mm256_storeu_ps(out + c0 + 8 * v, acc[v]);
        c0 += 8 * nv;
    }
    for (int c = c0; c < m; ++c) {
        float sum = 0.0f;
        for (int64_t i = 0; i < n; ++i) sum += p[i] * z[i * m + c];
        out[c] = sum;
    }
}

void unpack(const LatentTokens& t, int64_t i, float* z) {
    if (t.int4) {
        int4_unpack(t.latents[i], t.m, z);
        return;
    }
    const auto* h = reinterpret_cast<const uint16_t*>(t.latents[i]);
    for (int j = 0; j < t.m; ++j) z[j] = fp16_to_fp32(h[j]);
}

}  // namespace

void head_scores(const AttentionShape& s, const float* q, const float* k, int64_t ldk, int64_t n,
                 float* scores, int64_t lds) {
    const int dim = s.head_dim, group = s.n_heads / s.n_kv_heads;
    const __m256 scale = _mm256_set1_ps(s.scale);
    for (int h = 0; h < s.n_heads; ++h) {
        const float* qh = q + static_cast<int64_t>(h) * dim;
        const float* kg = k + static_cast<int64_t>(h / group) * dim;
        float* out = scores + h * lds;
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) {  // eight keys at a time
            __m256 acc[8];
            for (auto& a : acc) a = _mm256_setzero_ps();
            for (int d = 0; d < dim; d += 8) {
                const __m256 qd = _mm256_loadu_ps(qh + d);
                for (int j = 0; j < 8; ++j)
                    acc[j] = _mm256_fmadd_ps(qd, _mm256_loadu_ps(kg + (i + j) * ldk + d), acc[j]);
            }
            _mm256_storeu_ps(out + i, _mm256_mul_ps(reduce8(acc), scale));
        }
        for (; i < n; ++i) out[i] = s.scale * dot8<false>(qh, kg + i * ldk, dim);
    }
}

void latent_attention(const AttentionShape& s, const LatentTokens& t, float* out, float* lse,
                      ThreadPool& pool) {
    DS_CHECK(s.head_dim % 8 == 0 && s.head_dim <= 256, "unsupported head_dim");
    DS_CHECK(s.n_kv_heads > 0 && s.n_heads % s.n_kv_heads == 0 && s.n_heads <= kMaxHeads,
             "bad GQA shape");
    DS_CHECK(t.m > 0 && t.m <= kMaxLatent, "unsupported latent size");
    DS_CHECK(s.n_kv_heads * s.head_dim <= kMaxKvDim, "unsupported KV width");
    const int heads = s.n_heads, dim = s.head_dim, group = heads / s.n_kv_heads, m = t.m;
    const int64_t n = t.n;
    // Softmax weights in place of the scores, exp(s - max) per head. (The pieces below run on
    // the pool's threads: they reach this thread's buffers through plain pointers.)
    thread_local std::vector<float> p_buf, part_buf, w_buf, ref_buf;
    p_buf.assign(t.scores, t.scores + static_cast<size_t>(heads) * n);
    float* const p = p_buf.data();
    float mx[kMaxHeads];
    for (int h = 0; h < heads; ++h) {
        float* ph = p + h * n;
        mx[h] = -std::numeric_limits<float>::infinity();
        for (int64_t i = 0; i < n; ++i) mx[h] = std::max(mx[h], ph[i]);
        const __m256 mv = _mm256_set1_ps(mx[h]);
        int64_t i = 0;
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(ph + i, exp256(_mm256_sub_ps(_mm256_loadu_ps(ph + i), mv)));
        for (; i < n; ++i) ph[i] = std::exp(ph[i] - mx[h]);
    }
    // Per piece of tokens: sum of weights and weighted latents per head (latents unpacked
    // once per token); the pieces are then added in order.
    const int64_t pieces = (n + kTokenPiece - 1) / kTokenPiece;
    const size_t per_piece = static_cast<size_t>(heads) * (m + 1);
    part_buf.assign(static_cast<size_t>(pieces) * per_piece, 0.0f);
    float* const part = part_buf.data();
    pool.parallel_for(pieces, 1, [&](int64_t b, int64_t e) {
        thread_local std::vector<float> z;  // the piece's latents, unpacked
        z.resize(static_cast<size_t>(kTokenPiece) * m);
        for (int64_t piece = b; piece < e; ++piece) {
            float* acc = part + piece * per_piece;  // [heads][m], then [heads] sums
            const int64_t i0 = piece * kTokenPiece, i1 = std::min(n, i0 + kTokenPiece);
            for (int64_t i = i0; i < i1; ++i) unpack(t, i, z.data() + (i - i0) * m);
            for (int h = 0; h < heads; ++h) {
                const float* ph = p + h * n + i0;
                float sum = 0.0f;
                for (int64_t i = 0; i < i1 - i0; ++i) sum += ph[i];
                acc[static_cast<size_t>(heads) * m + h] = sum;
                weighted_rows(ph, z.data(), i1 - i0, m, acc + static_cast<size_t>(h) * m);
            }
        }
    });
    thread_local std::vector<float> zsum, l;
    zsum.assign(static_cast<size_t>(heads) * m, 0.0f);
    l.assign(static_cast<size_t>(heads), 0.0f);
    for (int64_t piece = 0; piece < pieces; ++piece) {
        const float* acc = part + piece * per_piece;
        for (size_t j = 0; j < zsum.size(); ++j) zsum[j] += acc[j];
        for (int h = 0; h < heads; ++h) l[h] += acc[static_cast<size_t>(heads) * m + h];
    }
    // Each reference's share of the weights, per head.
    w_buf.assign(static_cast<size_t>(t.n_refs) * heads, 0.0f);  // [ref][head]
    float* const w = w_buf.data();
    for (int64_t i = 0; i < n; ++i) {
        const int32_t* r = t.refs + i * t.ref_slots;
        int nr = 0;
        for (int q = 0; q < t.ref_slots; ++q) nr += r[q] >= 0;
        if (nr == 0) continue;
        const float inv = 1.0f / static_cast<float>(nr);
        for (int q = 0; q < t.ref_slots; ++q) {
            if (r[q] < 0) continue;
            float* wr = w + static_cast<size_t>(r[q]) * heads;
            for (int h = 0; h < heads; ++h) wr[h] += p[h * n + i] * inv;
        }
    }
    // The weighted reference rows, each read once for every head, per piece of references.
    const int64_t ref_pieces = (t.n_refs + kRefPiece - 1) / kRefPiece;
    const size_t out_size = static_cast<size_t>(heads) * dim;
    ref_buf.assign(static_cast<size_t>(ref_pieces) * out_size, 0.0f);
    float* const ref_part = ref_buf.data();
    pool.parallel_for(ref_pieces, 1, [&](int64_t b, int64_t e) {
        alignas(32) float v[kMaxKvDim];
        for (int64_t piece = b; piece < e; ++piece) {
            float* acc = ref_part + piece * out_size;
            const int64_t r1 = std::min(t.n_refs, (piece + 1) * kRefPiece);
            const int kv_bytes = s.n_kv_heads * dim * 2;
            for (int64_t r = piece * kRefPiece; r < r1; ++r) {
                // The rows lie far apart in the pool: ask for a later one while this one
                // is summed.
                if (r + kPrefetchAhead < r1) prefetch_row(t.ref_v[r + kPrefetchAhead], kv_bytes);
                const uint16_t* row = t.ref_v[r];
                for (int d = 0; d < s.n_kv_heads * dim; d += 8) {
                    _mm256_store_ps(v + d, _mm256_cvtph_ps(_mm_loadu_si128(
                                               reinterpret_cast<const __m128i*>(row + d))));
                }
                const float* wr = w + static_cast<size_t>(r) * heads;
                for (int h = 0; h < heads; ++h) {
                    if (wr[h] != 0.0f)
                        axpy(wr[h], v + (h / group) * dim, acc + static_cast<size_t>(h) * dim, dim);
                }
            }
        }
    });
    // out = (Dec_v rows of the head's KV head . weighted latents + weighted references) / sum.
    for (int h = 0; h < heads; ++h) {
        const int g = h / group;
        float* o = out + static_cast<size_t>(h) * dim;
        for (int d = 0; d < dim; ++d) {
            o[d] = dot8<false>(t.wd_v + static_cast<size_t>(g * dim + d) * m,
                       zsum.data() + static_cast<size_t>(h) * m, m);
        }
        for (int64_t piece = 0; piece < ref_pieces; ++piece) {
            const float* acc = ref_part + piece * out_size + static_cast<size_t>(h) * dim;
            for (int d = 0; d < dim; ++d) o[d] += acc[d];
        }
        const float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
        for (int d = 0; d < dim; ++d) o[d] *= inv;
        lse[h] = l[h] > 0.0f ? mx[h] + std::log(l[h]) : -std::numeric_limits<float>::infinity();
    }
}

}  // namespace deltaserve::kernels
