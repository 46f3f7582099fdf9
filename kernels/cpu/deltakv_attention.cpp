// latent_attention: a decode step's attention over DeltaKV tokens whose values stay latent.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "deltaserve/common/fp16.h"
#include "deltaserve/common/status.h"
#include "cpu_features.h"
#include "deltakv_int4_kernels.h"
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

// fp16 latent i as floats.
void unpack(const LatentTokens& t, int64_t i, float* z) {
    const auto* h = reinterpret_cast<const uint16_t*>(t.latents[i]);
    for (int j = 0; j < t.m; ++j) z[j] = fp16_to_fp32(h[j]);
}

// H heads x 16 columns from c0 (two registers per head), accumulated over n tokens.
template <int H>
void weighted_pass(const float* w, int64_t ldw, const uint8_t* codes, int64_t ldc, int64_t n,
                   int c0, float* acc, int64_t lda) {
    __m256 a[H][2];
    for (int h = 0; h < H; ++h) {
        for (int v = 0; v < 2; ++v) a[h][v] = _mm256_loadu_ps(acc + h * lda + c0 + 8 * v);
    }
    for (int64_t i = 0; i < n; ++i) {
        __m256 c[2];
        for (int v = 0; v < 2; ++v) {
            c[v] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i * ldc + c0 + 8 * v))));
        }
        for (int h = 0; h < H; ++h) {
            const __m256 wh = _mm256_broadcast_ss(w + h * ldw + i);
            for (int v = 0; v < 2; ++v) a[h][v] = _mm256_fmadd_ps(wh, c[v], a[h][v]);
        }
    }
    for (int h = 0; h < H; ++h) {
        for (int v = 0; v < 2; ++v) _mm256_storeu_ps(acc + h * lda + c0 + 8 * v, a[h][v]);
    }
}

template <int H>
void weighted_heads(const float* w, int64_t ldw, const uint8_t* codes, int64_t ldc, int64_t n,
                    int cols, float* acc, int64_t lda) {
    for (int c0 = 0; c0 < cols; c0 += 16) weighted_pass<H>(w, ldw, codes, ldc, n, c0, acc, lda);
}

}  // namespace

void int4_weighted_avx2(const float* w, int64_t ldw, int heads, const uint8_t* codes, int64_t ldc,
                        int64_t n, int cols, float* acc, int64_t lda) {
    using Fn = void (*)(const float*, int64_t, const uint8_t*, int64_t, int64_t, int, float*, int64_t);
    static constexpr Fn kHeads[] = {weighted_heads<1>, weighted_heads<2>, weighted_heads<3>,
                                    weighted_heads<4>, weighted_heads<5>, weighted_heads<6>};
    // Heads in even groups of at most 6: 12 accumulators, 2 codes and a weight in 16 registers.
    const int groups = (heads + 5) / 6;
    for (int h0 = 0, g = 0; g < groups; ++g) {
        const int hn = (heads - h0) / (groups - g);
        kHeads[hn - 1](w + h0 * ldw, ldw, codes, ldc, n, cols, acc + h0 * lda, lda);
        h0 += hn;
    }
}

namespace {

// A piece's weighted int4 latents: acc[h * m + j] = sum_i p[h][i] z_ij over tokens [i0, i1).
void weighted_int4(const LatentTokens& t, const float* p, int heads, int64_t i0, int64_t i1, float* acc) {
    static const Int4WeightedFn weighted = cpu_features().avx512f ? int4_weighted_avx512 : int4_weighted_avx2;
    const int m = t.m, m16 = int4_code_stride(m);
    const int64_t n = i1 - i0, ldp = static_cast<int64_t>(t.n);
    thread_local std::vector<uint8_t> codes;
    thread_local std::vector<float> w, wide;
    codes.resize(static_cast<size_t>(n) * m16);
    w.resize(static_cast<size_t>(heads) * n);
    wide.assign(static_cast<size_t>(heads) * m16, 0.0f);
    // z_ij = lo_i + s_i code_ij: sum_i p_i z_ij = sum_i (p_i s_i) code_ij + sum_i p_i lo_i.
    float lo[kTokenPiece], s[kTokenPiece];
    for (int64_t i = 0; i < n; ++i) {
        uint16_t s16, lo16;
        std::memcpy(&s16, t.latents[i0 + i], 2);
        std::memcpy(&lo16, t.latents[i0 + i] + 2, 2);
        s[i] = fp16_to_fp32(s16);
        lo[i] = fp16_to_fp32(lo16);
    }
    const uint8_t* c = t.codes != nullptr ? t.codes + i0 * m16 : codes.data();
    if (t.codes == nullptr) int4_latent_codes(t.latents + i0, n, m, codes.data());
    for (int h = 0; h < heads; ++h) {
        const float* ph = p + h * ldp + i0;
        for (int64_t i = 0; i < n; ++i) w[h * n + i] = ph[i] * s[i];
    }
    weighted(w.data(), n, heads, c, m16, n, m16, wide.data(), m16);
    for (int h = 0; h < heads; ++h) {
        const float* ph = p + h * ldp + i0;
        float base = 0.0f;
        for (int64_t i = 0; i < n; ++i) base += ph[i] * lo[i];
        for (int j = 0; j < m; ++j) acc[static_cast<size_t>(h) * m + j] = wide[static_cast<size_t>(h) * m16 + j] + base;
    }
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
        // Eight keys at a time; the last few repeat the last key, so that a key's score has
        // the same bits wherever it falls in the rows.
        for (int64_t i = 0; i < n; i += 8) {
            const int64_t nk = std::min<int64_t>(8, n - i);
            const float* kr[8];
            for (int j = 0; j < 8; ++j) kr[j] = kg + (i + std::min<int64_t>(j, nk - 1)) * ldk;
            __m256 acc[8];
            for (auto& a : acc) a = _mm256_setzero_ps();
            for (int d = 0; d < dim; d += 8) {
                const __m256 qd = _mm256_loadu_ps(qh + d);
                for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(qd, _mm256_loadu_ps(kr[j] + d), acc[j]);
            }
            alignas(32) float sc[8];
            _mm256_store_ps(sc, _mm256_mul_ps(reduce8(acc), scale));
            std::copy_n(sc, nk, out + i);
        }
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
    // Per head, on the pool's threads: the softmax weights, exp(s - max). (The regions below
    // reach this thread's buffers through plain pointers.)
    thread_local std::vector<float> p_buf, part_buf, w_buf, ref_buf;
    p_buf.resize(static_cast<size_t>(heads) * n);
    w_buf.assign(static_cast<size_t>(t.n_refs) * heads, 0.0f);  // [ref][head]
    float* const p = p_buf.data();
    float* const w = w_buf.data();
    float mx[kMaxHeads];
    pool.parallel_for(heads, 1, [&](int64_t h0, int64_t h1) {
        for (int64_t h = h0; h < h1; ++h) {
            const float* sh = t.scores + h * n;
            float* ph = p + h * n;
            float m_h = -std::numeric_limits<float>::infinity();
            for (int64_t i = 0; i < n; ++i) m_h = std::max(m_h, sh[i]);
            mx[h] = m_h;
            const __m256 mv = _mm256_set1_ps(m_h);
            int64_t i = 0;
            for (; i + 8 <= n; i += 8)
                _mm256_storeu_ps(ph + i, exp256(_mm256_sub_ps(_mm256_loadu_ps(sh + i), mv)));
            for (; i < n; ++i) ph[i] = std::exp(sh[i] - m_h);
        }
    });
    // Each reference's share of the weights: the tokens naming it (in token order, with
    // their 1 / references), then per reference on the pool, its sum over them.
    thread_local std::vector<int32_t> first, user;
    thread_local std::vector<float> share;
    first.assign(static_cast<size_t>(t.n_refs) + 1, 0);
    for (int64_t i = 0; i < n * t.ref_slots; ++i) {
        if (t.refs[i] >= 0) ++first[static_cast<size_t>(t.refs[i]) + 1];
    }
    for (int64_t r = 0; r < t.n_refs; ++r) first[r + 1] += first[r];
    user.resize(static_cast<size_t>(first[t.n_refs]));
    share.resize(user.size());
    {
        thread_local std::vector<int32_t> next;
        next.assign(first.begin(), first.end() - 1);
        for (int64_t i = 0; i < n; ++i) {
            const int32_t* r = t.refs + i * t.ref_slots;
            int nr = 0;
            for (int q = 0; q < t.ref_slots; ++q) nr += r[q] >= 0;
            const float inv = nr > 0 ? 1.0f / static_cast<float>(nr) : 0.0f;
            for (int q = 0; q < t.ref_slots; ++q) {
                if (r[q] < 0) continue;
                user[next[r[q]]] = static_cast<int32_t>(i);
                share[next[r[q]]++] = inv;
            }
        }
    }
    const int32_t* const users = user.data();
    const float* const shares = share.data();
    const int32_t* const firsts = first.data();
    pool.parallel_for(t.n_refs, 16, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            float acc[kMaxHeads] = {};  // not w's row: stores to it would wait on each other
            for (int32_t u = firsts[r]; u < firsts[r + 1]; ++u) {
                const float* pu = p + users[u];
                for (int h = 0; h < heads; ++h) acc[h] = std::fma(pu[h * n], shares[u], acc[h]);
            }
            std::copy_n(acc, heads, w + static_cast<size_t>(r) * heads);
        }
    });
    // Per piece of tokens: sum of weights and weighted latents per head (int4 codes weighted
    // as they are, fp16 latents unpacked once per token); the pieces are then added in order.
    const int64_t pieces = (n + kTokenPiece - 1) / kTokenPiece;
    const size_t per_piece = static_cast<size_t>(heads) * (m + 1);
    part_buf.resize(static_cast<size_t>(pieces) * per_piece);  // every piece writes all of its own
    float* const part = part_buf.data();
    // In parts, as the caller's scoring split the tokens: each thread reads the codes it made.
    pool.parallel_for_affine(pieces, 1, [&](int64_t b, int64_t e) {
        thread_local std::vector<float> z;  // the piece's latents, unpacked
        z.resize(static_cast<size_t>(kTokenPiece) * m);
        for (int64_t piece = b; piece < e; ++piece) {
            float* acc = part + piece * per_piece;  // [heads][m], then [heads] sums
            const int64_t i0 = piece * kTokenPiece, i1 = std::min(n, i0 + kTokenPiece);
            for (int h = 0; h < heads; ++h) {
                const float* ph = p + h * n + i0;
                float sum = 0.0f;
                for (int64_t i = 0; i < i1 - i0; ++i) sum += ph[i];
                acc[static_cast<size_t>(heads) * m + h] = sum;
            }
            if (t.int4) {
                weighted_int4(t, p, heads, i0, i1, acc);
                continue;
            }
            for (int64_t i = i0; i < i1; ++i) unpack(t, i, z.data() + (i - i0) * m);
            for (int h = 0; h < heads; ++h)
                weighted_rows(p + h * n + i0, z.data(), i1 - i0, m, acc + static_cast<size_t>(h) * m);
        }
    });
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
    // Per head: the pieces' sums added in order, then out = (Dec_v rows of the head's KV head
    // . weighted latents + weighted references) / sum.
    pool.parallel_for(heads, 1, [&](int64_t h0, int64_t h1) {
        alignas(32) float zsum[kMaxLatent];
        for (int64_t h = h0; h < h1; ++h) {
            std::fill_n(zsum, m, 0.0f);
            float l = 0.0f;
            for (int64_t piece = 0; piece < pieces; ++piece) {
                const float* acc = part + piece * per_piece;
                for (int j = 0; j < m; ++j) zsum[j] += acc[h * m + j];
                l += acc[static_cast<size_t>(heads) * m + h];
            }
            const int g = static_cast<int>(h) / group;
            float* o = out + h * dim;
            for (int d = 0; d < dim; ++d) o[d] = dot8<false>(t.wd_v + static_cast<size_t>(g * dim + d) * m, zsum, m);
            for (int64_t piece = 0; piece < ref_pieces; ++piece) {
                const float* acc = ref_part + piece * out_size + h * dim;
                for (int d = 0; d < dim; ++d) o[d] += acc[d];
            }
            const float inv = l > 0.0f ? 1.0f / l : 0.0f;
            for (int d = 0; d < dim; ++d) o[d] *= inv;
            lse[h] = l > 0.0f ? mx[h] + std::log(l) : -std::numeric_limits<float>::infinity();
        }
    });
}

}  // namespace deltaserve::kernels
