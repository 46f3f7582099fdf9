#include "deltaserve/kernels/attention.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "deltaserve/common/fp16.h"
#include "deltaserve/common/status.h"
#include "deltaserve/kernels/attention_support.h"
#include "simd_math.h"

namespace deltaserve::kernels {

namespace {

constexpr int kKeyTile = 32;  // keys converted to fp32 at a time
constexpr int kMaxRows = 48;  // (query, head) rows processed together
constexpr int kMaxHeadDim = 256;
constexpr int kMaxKvHeads = 64;
constexpr int32_t kSplitKeys = 512;  // key range per work item when splitting decode
constexpr int kFewRows = 12;         // at most this many rows: attend_few_rows

// Online-softmax state of a set of rows: running max m, sum l and unnormalised output o.
struct Partial {
    int rows = 0;
    int dim = 0;
    float* m = nullptr;
    float* l = nullptr;
    float* o = nullptr;  // rows x dim
    void reset() {
        for (int r = 0; r < rows; ++r) {
            m[r] = -std::numeric_limits<float>::infinity();
            l[r] = 0.0f;
        }
        std::fill(o, o + static_cast<size_t>(rows) * dim, 0.0f);
    }
};

// Keys [k0, k0 + nk) of KV head g as fp32: kt transposed (dim x kKeyTile), vt row-major.
void load_tile(const KvView& kv, int g, int dim, int32_t k0, int nk, float* kt, float* vt) {
    const int32_t* slots = kv.slots_of(g);
    for (int j = 0; j < nk; ++j) {
        const size_t off = static_cast<size_t>(slots[k0 + j]) * kv.row_stride + kv.head_offset(g);
        const uint8_t* krow = kv.k + off;
        const uint8_t* vrow = kv.v + off;
        float kbuf[kMaxHeadDim];
        if (kv.dtype == DType::kF16) {
            for (int d = 0; d < dim; d += 8) {
                _mm256_storeu_ps(kbuf + d, _mm256_cvtph_ps(_mm_loadu_si128(
                                               reinterpret_cast<const __m128i*>(krow + 2 * d))));
                _mm256_storeu_ps(vt + j * dim + d,
                                 _mm256_cvtph_ps(_mm_loadu_si128(
                                     reinterpret_cast<const __m128i*>(vrow + 2 * d))));
            }
        } else {
            std::copy_n(reinterpret_cast<const float*>(krow), dim, kbuf);
            std::copy_n(reinterpret_cast<const float*>(vrow), dim, vt + j * dim);
        }
        for (int d = 0; d < dim; ++d) kt[d * kKeyTile + j] = kbuf[d];
    }
    for (int j = nk; j < kKeyTile; ++j) {
        for (int d = 0; d < dim; ++d) kt[d * kKeyTile + j] = 0.0f;
    }
}

// One online-softmax step for row r: sc[0, n) holds its scores for a run of keys (n a
// multiple of 8; only [first, valid) count, first < valid). They become weights exp(s - m) in
// place (zero outside), the row's max and sum move on, and the returned factor is what the
// row's output must be rescaled by before the weighted values are added.
float softmax_step(Partial& st, int r, float* sc, int n, int first, int valid) {
    for (int j = 0; j < first; ++j) sc[j] = sc[first];  // out of the max's way
    float mx;
    if (valid == n) {  // the max of whole vectors (exact, in any order)
        __m256 m8 = _mm256_load_ps(sc);
        for (int j = 8; j < n; j += 8) m8 = _mm256_max_ps(m8, _mm256_load_ps(sc + j));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        mx = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    } else {
        mx = sc[0];
        for (int j = 1; j < valid; ++j) mx = std::max(mx, sc[j]);
    }
    const float m_new = std::max(st.m[r], mx);
    const float corr = std::exp(st.m[r] - m_new);
    const __m256 mv = _mm256_set1_ps(m_new);
    for (int j = 0; j < n; j += 8) {
        _mm256_store_ps(sc + j, exp256(_mm256_sub_ps(_mm256_load_ps(sc + j), mv)));
    }
    for (int j = 0; j < first; ++j) sc[j] = 0.0f;
    float sum = 0.0f;
    for (int j = 0; j < valid; ++j) sum += sc[j];
    for (int j = valid; j < n; ++j) sc[j] = 0.0f;
    st.l[r] = st.l[r] * corr + sum;
    st.m[r] = m_new;
    return corr;
}

// NC chunks of 8 output values from d0: o = o * corr + sum_j p[j] * V_j, the keys in order
// for every value, the chunks' sums side by side (one chain each, not one after another).
template <int NC, class LoadV>
inline void weigh_chunks(float* o, __m256 cv, const float* p, int valid, int d0, LoadV& load_v) {
    __m256 acc[NC];
    for (int c = 0; c < NC; ++c) acc[c] = _mm256_mul_ps(_mm256_loadu_ps(o + d0 + 8 * c), cv);
    for (int j = 0; j < valid; ++j) {
        const __m256 pj = _mm256_set1_ps(p[j]);
        for (int c = 0; c < NC; ++c) acc[c] = _mm256_fmadd_ps(pj, load_v(j, d0 + 8 * c), acc[c]);
    }
    for (int c = 0; c < NC; ++c) _mm256_storeu_ps(o + d0 + 8 * c, acc[c]);
}

// o = o * corr + sum_j p[j] * V_j, with load_v(j, d) giving 8 values of V_j from d.
template <class LoadV>
void add_weighted_values(float* o, float corr, const float* p, int valid, int dim, LoadV load_v) {
    const __m256 cv = _mm256_set1_ps(corr);
    int d0 = 0;
    for (; d0 + 64 <= dim; d0 += 64) weigh_chunks<8>(o, cv, p, valid, d0, load_v);
    // The rest (dim is a multiple of 8): 4, 2 and 1 chunks.
    if (dim - d0 >= 32) {
        weigh_chunks<4>(o, cv, p, valid, d0, load_v);
        d0 += 32;
    }
    if (dim - d0 >= 16) {
        weigh_chunks<2>(o, cv, p, valid, d0, load_v);
        d0 += 16;
    }
    if (dim - d0 >= 8) weigh_chunks<1>(o, cv, p, valid, d0, load_v);
}

// The first key row r sees (its window's; 0 without one) and whether it sees any of keys
// [t0, t0 + nk).
inline int32_t first_key(const KvView& kv, int32_t qpos) {
    return kv.window > 0 ? std::max(0, qpos - kv.window + 1) : 0;
}
inline bool sees(const KvView& kv, int32_t qpos, int32_t t0, int32_t nk) {
    return qpos - t0 + 1 > 0 && first_key(kv, qpos) < t0 + nk;
}

// Attends rows (query vectors qrow[r] at positions qpos[r]) over keys [k0, k1) of head g.
void attend(const AttentionShape& s, const KvView& kv, int g, const float* const* qrow,
            const int32_t* qpos, int n_rows, int32_t k0, int32_t k1, Partial& st) {
    const int dim = s.head_dim;
    alignas(32) float kt[kMaxHeadDim * kKeyTile];
    alignas(32) float vt[kKeyTile * kMaxHeadDim];
    constexpr int kVecs = kKeyTile / 8;
    for (int32_t t0 = k0; t0 < k1; t0 += kKeyTile) {
        const int nk = std::min<int32_t>(kKeyTile, k1 - t0);
        load_tile(kv, g, dim, t0, nk, kt, vt);
        // Scores of two rows at a time: each key tile's loads serve both, and eight sums
        // run side by side.
        for (int r = 0; r < n_rows;) {
            if (!sees(kv, qpos[r], t0, nk)) {  // no key of this tile is visible to the row
                ++r;
                continue;
            }
            const int pair = r + 1 < n_rows && sees(kv, qpos[r + 1], t0, nk) ? 2 : 1;
            __m256 acc[2][kVecs];
            for (int i = 0; i < 2; ++i) {
                for (int v = 0; v < kVecs; ++v) acc[i][v] = _mm256_setzero_ps();
            }
            if (pair == 2) {
                const float* q0 = qrow[r];
                const float* q1 = qrow[r + 1];
                for (int d = 0; d < dim; ++d) {
                    const __m256 a = _mm256_set1_ps(q0[d]);
                    const __m256 b = _mm256_set1_ps(q1[d]);
                    for (int v = 0; v < kVecs; ++v) {
                        const __m256 kv8 = _mm256_load_ps(kt + d * kKeyTile + 8 * v);
                        acc[0][v] = _mm256_fmadd_ps(a, kv8, acc[0][v]);
                        acc[1][v] = _mm256_fmadd_ps(b, kv8, acc[1][v]);
                    }
                }
            } else {
                const float* q = qrow[r];
                for (int d = 0; d < dim; ++d) {
                    const __m256 qd = _mm256_set1_ps(q[d]);
                    for (int v = 0; v < kVecs; ++v) {
                        acc[0][v] = _mm256_fmadd_ps(qd, _mm256_load_ps(kt + d * kKeyTile + 8 * v),
                                                    acc[0][v]);
                    }
                }
            }
            for (int i = 0; i < pair; ++i, ++r) {
                const int valid = std::min(nk, qpos[r] - t0 + 1);
                const int first = std::max(0, first_key(kv, qpos[r]) - t0);
                alignas(32) float sc[kKeyTile];
                const __m256 scale = _mm256_set1_ps(s.scale);
                for (int v = 0; v < kVecs; ++v)
                    _mm256_store_ps(sc + 8 * v, _mm256_mul_ps(acc[i][v], scale));
                const float corr = softmax_step(st, r, sc, kKeyTile, first, valid);
                add_weighted_values(st.o + static_cast<size_t>(r) * dim, corr, sc, valid, dim,
                                    [&](int j, int d) { return _mm256_load_ps(vt + j * dim + d); });
            }
        }
    }
}

inline __m256 load_kv8(const uint8_t* row, int d, DType dtype) {
    if (dtype == DType::kF16) {
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * d)));
    }
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + d);
}

// The few-rows case (decoding): scores straight from the K rows, 8 keys at a time, without
// converting and transposing a tile first, which only pays off when many rows share it.
// One tile: keys [t0, t0 + 8) (fewer at k1) of head g.
void few_rows_tile(const AttentionShape& s, const KvView& kv, int g, const float* const* qrow,
                   const int32_t* qpos, int n_rows, int32_t t0, int32_t k1, Partial& st) {
    const int dim = s.head_dim;
    const size_t head_off = kv.head_offset(g);
    const int32_t* slots = kv.slots_of(g);
    const int nk = std::min<int32_t>(8, k1 - t0);
    const uint8_t* krow[8];
    const uint8_t* vrow[8];
    for (int j = 0; j < 8; ++j) {
        const size_t off =
            static_cast<size_t>(slots[t0 + std::min(j, nk - 1)]) * kv.row_stride + head_off;
        krow[j] = kv.k + off;
        vrow[j] = kv.v + off;
    }
    __m256 part[kFewRows][8];
    for (int j = 0; j < 8; ++j) {
        for (int r = 0; r < n_rows; ++r) part[r][j] = _mm256_setzero_ps();
        for (int d = 0; d < dim; d += 8) {
            const __m256 kf = load_kv8(krow[j], d, kv.dtype);
            for (int r = 0; r < n_rows; ++r) {
                part[r][j] = _mm256_fmadd_ps(_mm256_loadu_ps(qrow[r] + d), kf, part[r][j]);
            }
        }
    }
    for (int r = 0; r < n_rows; ++r) {
        if (!sees(kv, qpos[r], t0, nk)) continue;
        const int valid = std::min(nk, qpos[r] - t0 + 1);
        const int first = std::max(0, first_key(kv, qpos[r]) - t0);
        alignas(32) float sc[8];
        _mm256_store_ps(sc, _mm256_mul_ps(reduce8(part[r]), _mm256_set1_ps(s.scale)));
        const float corr = softmax_step(st, r, sc, 8, first, valid);
        add_weighted_values(st.o + static_cast<size_t>(r) * dim, corr, sc, valid, dim,
                            [&](int j, int d) { return load_kv8(vrow[j], d, kv.dtype); });
    }
}

// Keys [k0, k1) of the heads [g0, g0 + n_heads) of a view whose heads share their entries,
// each head its rows qrow[i] and its state st[i]: a tile's keys for every head before the next
// tile, so each K and V row (all heads) is read once, in order, and the hardware's
// prefetcher follows (a head at a time passed over the rows once per head: 1.35x slower at
// 4096 keys on this host). The same arithmetic per head as one head at a time.
void attend_few_rows(const AttentionShape& s, const KvView& kv, int g0, int n_heads,
                     const float* const* const* qrow, const int32_t* qpos, int n_rows, int32_t k0,
                     int32_t k1, Partial* st) {
    int32_t last_visible = 0;
    int32_t first_visible = k1;
    for (int r = 0; r < n_rows; ++r) {
        last_visible = std::max(last_visible, qpos[r] + 1);
        first_visible = std::min(first_visible, first_key(kv, qpos[r]));
    }
    k1 = std::min(k1, last_visible);
    k0 = std::max(k0, first_visible);
    for (int32_t t0 = k0; t0 < k1; t0 += 8) {
        for (int i = 0; i < n_heads; ++i)
            few_rows_tile(s, kv, g0 + i, qrow[i], qpos, n_rows, t0, k1, st[i]);
    }
}

// Merges partial states b into a (same rows).
void merge(Partial& a, const Partial& b) {
    for (int r = 0; r < a.rows; ++r) {
        if (b.l[r] == 0.0f) continue;
        const float m = std::max(a.m[r], b.m[r]);
        const float ca = std::exp(a.m[r] - m);
        const float cb = std::exp(b.m[r] - m);
        a.l[r] = a.l[r] * ca + b.l[r] * cb;
        a.m[r] = m;
        float* ao = a.o + static_cast<size_t>(r) * a.dim;
        const float* bo = b.o + static_cast<size_t>(r) * b.dim;
        for (int d = 0; d < a.dim; ++d) ao[d] = ao[d] * ca + bo[d] * cb;
    }
}

// One Partial per work item, each sized for the largest item (max_rows rows).
struct PartialBuffer {
    std::vector<float>& data;
    int max_rows = 0;
    Partial make(int rows, int dim, size_t index) {
        const size_t per = static_cast<size_t>(max_rows) * (dim + 2);
        Partial p;
        p.rows = rows;
        p.dim = dim;
        p.m = data.data() + index * per;
        p.l = p.m + rows;
        p.o = p.l + rows;
        return p;
    }
};

// Rows of a query block [i0, i1) for KV head g: one row per (query, head of the group).
int gather_rows(const AttentionShape& s, const float* q, int64_t ldq, int32_t p0, int g, int32_t i0,
                int32_t i1, const float** qrow, int32_t* qpos) {
    const int group = s.n_heads / s.n_kv_heads;
    int n = 0;
    for (int32_t i = i0; i < i1; ++i) {
        for (int hh = 0; hh < group; ++hh) {
            qrow[n] = q + i * ldq + static_cast<int64_t>(g * group + hh) * s.head_dim;
            qpos[n] = p0 + i;
            ++n;
        }
    }
    return n;
}

void write_rows(const AttentionShape& s, const Partial& st, int g, int32_t i0, int32_t i1,
                float* out, int64_t ldo, float* lse) {
    const int group = s.n_heads / s.n_kv_heads;
    int r = 0;
    for (int32_t i = i0; i < i1; ++i) {
        for (int hh = 0; hh < group; ++hh, ++r) {
            float* dst = out + i * ldo + static_cast<int64_t>(g * group + hh) * s.head_dim;
            const float inv = st.l[r] > 0.0f ? 1.0f / st.l[r] : 0.0f;
            if (lse != nullptr) {
                lse[i * s.n_heads + g * group + hh] = st.l[r] > 0.0f
                                                          ? st.m[r] + std::log(st.l[r])
                                                          : -std::numeric_limits<float>::infinity();
            }
            const float* o = st.o + static_cast<size_t>(r) * s.head_dim;
            for (int d = 0; d < s.head_dim; ++d) dst[d] = o[d] * inv;
        }
    }
}

}  // namespace

Status attention_shape_supported(const AttentionShape& s) {
    if (s.head_dim <= 0 || s.head_dim % 8 != 0 || s.head_dim > kMaxHeadDim) {
        return unimplemented("head size " + std::to_string(s.head_dim) +
                             ": the attention kernels take multiples of 8 up to " +
                             std::to_string(kMaxHeadDim));
    }
    if (s.n_kv_heads <= 0 || s.n_heads <= 0 || s.n_heads % s.n_kv_heads != 0) {
        return unimplemented(std::to_string(s.n_heads) + " query heads over " +
                             std::to_string(s.n_kv_heads) + " KV heads");
    }
    if (s.n_kv_heads > kMaxKvHeads) {
        return unimplemented(std::to_string(s.n_kv_heads) +
                             " KV heads: the attention kernels take up to " +
                             std::to_string(kMaxKvHeads));
    }
    if (s.n_heads / s.n_kv_heads > kMaxRows) {
        return unimplemented(std::to_string(s.n_heads / s.n_kv_heads) +
                             " query heads per KV head: the attention kernels take up to " +
                             std::to_string(kMaxRows));
    }
    return {};
}

void attention(const AttentionShape& s, const KvView& kv_in, const float* q, int64_t ldq,
               int32_t n_q, float* out, int64_t ldo, ThreadPool& pool, float* lse, bool causal) {
    KvView kv = kv_in;
    if (!causal) kv.window = 0;  // a window is causal
    DS_CHECK(s.head_dim % 8 == 0 && s.head_dim <= kMaxHeadDim, "unsupported head_dim");
    DS_CHECK(s.n_kv_heads > 0 && s.n_kv_heads <= kMaxKvHeads && s.n_heads % s.n_kv_heads == 0,
             "bad GQA shape");
    int32_t n_keys = 0;
    for (int g = 0; g < s.n_kv_heads; ++g) {
        DS_CHECK(!causal || kv.n_of(g) >= n_q, "fewer entries than queries");
        n_keys = std::max(n_keys, kv.n_of(g));
    }
    const int group = s.n_heads / s.n_kv_heads;
    DS_CHECK(group <= kMaxRows, "too many query heads per KV head");
    const int32_t q_block = std::max(1, kMaxRows / group);
    const int32_t n_qblocks = (n_q + q_block - 1) / q_block;
    // Few query blocks over many keys (decode): split the keys too, merge afterwards.
    const int32_t span = kv.window > 0 ? std::min(n_keys, kv.window + n_q - 1) : n_keys;
    const int32_t splits =
        n_qblocks == 1 ? std::max<int32_t>(1, (span + kSplitKeys - 1) / kSplitKeys) : 1;
    const int rows = std::min(n_q, q_block) * group;
    const int64_t n_items = static_cast<int64_t>(s.n_kv_heads) * n_qblocks * splits;

    // Reused across calls (once per layer and token): no allocation on the decode path.
    thread_local std::vector<float> storage;
    PartialBuffer buf{storage};
    buf.max_rows = rows;
    buf.data.resize(static_cast<size_t>(n_items) * rows * (s.head_dim + 2));
    // Items are (query block, key split, KV head) with the head fastest, and a thread takes
    // every head of one key range at once: K/V rows carry all heads, so the rows one head
    // pulls into the cache are still there for the next head instead of being fetched again
    // (the few-rows kernel goes further: each tile of keys for all heads, where every head
    // reads the same entries).
    const auto item_index = [&](int32_t qb, int32_t sp, int g) {
        return (static_cast<int64_t>(qb) * splits + sp) * s.n_kv_heads + g;
    };
    const bool shared_entries = kv.head_slots == nullptr && kv.head_n == nullptr;
    pool.parallel_for(static_cast<int64_t>(n_qblocks) * splits, 1, [&](int64_t b, int64_t e) {
        const float* qrow[kMaxKvHeads][kMaxRows];
        const float* const* heads_rows[kMaxKvHeads];
        int32_t qpos[kMaxKvHeads][kMaxRows];
        Partial st[kMaxKvHeads];
        for (int64_t unit = b; unit < e; ++unit) {
            const int32_t qb = static_cast<int32_t>(unit / splits);
            const int32_t sp = static_cast<int32_t>(unit % splits);
            const int32_t i0 = qb * q_block;
            const int32_t i1 = std::min(n_q, i0 + q_block);
            int n_rows = 0;
            int32_t k0[kMaxKvHeads] = {}, k1[kMaxKvHeads] = {};
            for (int g = 0; g < s.n_kv_heads; ++g) {
                // Entries before the new ones; without the causal mask every entry is.
                const int32_t p0 = causal ? kv.n_of(g) - n_q : kv.n_of(g);
                n_rows = gather_rows(s, q, ldq, p0, g, i0, i1, qrow[g], qpos[g]);
                heads_rows[g] = qrow[g];
                const int32_t last = std::min(kv.n_of(g), p0 + i1);  // keys [0, last) visible
                const int32_t first = std::min(last, first_key(kv, p0 + i0));
                const int32_t per = (last - first + splits - 1) / splits;
                k0[g] = std::min(last, first + sp * per);
                k1[g] = std::min(last, k0[g] + per);
                st[g] = buf.make(n_rows, s.head_dim, static_cast<size_t>(item_index(qb, sp, g)));
                st[g].reset();
            }
            if (n_rows <= kFewRows && shared_entries) {
                attend_few_rows(s, kv, 0, s.n_kv_heads, heads_rows, qpos[0], n_rows, k0[0], k1[0],
                                st);
            } else {
                for (int g = 0; g < s.n_kv_heads; ++g) {
                    if (n_rows <= kFewRows) {
                        attend_few_rows(s, kv, g, 1, &heads_rows[g], qpos[g], n_rows, k0[g], k1[g],
                                        &st[g]);
                    } else {
                        attend(s, kv, g, qrow[g], qpos[g], n_rows, k0[g], k1[g], st[g]);
                    }
                }
            }
            if (splits == 1) {
                for (int g = 0; g < s.n_kv_heads; ++g)
                    write_rows(s, st[g], g, i0, i1, out, ldo, lse);
            }
        }
    });
    if (splits == 1) return;
    for (int g = 0; g < s.n_kv_heads; ++g) {
        Partial acc = buf.make(rows, s.head_dim, static_cast<size_t>(item_index(0, 0, g)));
        for (int32_t sp = 1; sp < splits; ++sp) {
            merge(acc, buf.make(rows, s.head_dim, static_cast<size_t>(item_index(0, sp, g))));
        }
        write_rows(s, acc, g, 0, n_q, out, ldo, lse);
    }
}

void merge_attention(float* out, float* lse, const float* out_b, const float* lse_b, int n_rows,
                     int head_dim) {
    for (int r = 0; r < n_rows; ++r) {
        const float m = std::max(lse[r], lse_b[r]);
        if (m == -std::numeric_limits<float>::infinity()) continue;  // both empty
        const float wa = std::exp(lse[r] - m), wb = std::exp(lse_b[r] - m);
        const float inv = 1.0f / (wa + wb);
        float* o = out + static_cast<size_t>(r) * head_dim;
        const float* ob = out_b + static_cast<size_t>(r) * head_dim;
        for (int d = 0; d < head_dim; ++d) o[d] = (o[d] * wa + ob[d] * wb) * inv;
        lse[r] = m + std::log(wa + wb);
    }
}

void attention_reference(const AttentionShape& s, const KvView& kv, const float* q, int64_t ldq,
                         int32_t n_q, float* out, int64_t ldo) {
    const int group = s.n_heads / s.n_kv_heads;
    const size_t elem = kv.dtype == DType::kF16 ? 2 : 4;
    auto value = [&](const uint8_t* base, int32_t pos, int g, int d) {
        const uint8_t* p = base + static_cast<size_t>(kv.slots_of(g)[pos]) * kv.row_stride +
                           kv.head_offset(g) + static_cast<size_t>(d) * elem;
        if (kv.dtype == DType::kF16) {
            uint16_t h;
            std::memcpy(&h, p, 2);
            return fp16_to_fp32(h);
        }
        float f;
        std::memcpy(&f, p, 4);
        return f;
    };
    std::vector<double> w;
    for (int32_t i = 0; i < n_q; ++i) {
        for (int h = 0; h < s.n_heads; ++h) {
            const int g = h / group;
            const int32_t n = kv.n_of(g) - n_q + i + 1;
            const int32_t t0 = kv.window > 0 ? std::max(0, n - kv.window) : 0;
            const float* qh = q + i * ldq + static_cast<int64_t>(h) * s.head_dim;
            w.assign(static_cast<size_t>(n), 0.0);
            double mx = -1e300;
            for (int32_t t = t0; t < n; ++t) {
                double dot = 0;
                for (int d = 0; d < s.head_dim; ++d) dot += double(qh[d]) * value(kv.k, t, g, d);
                w[t] = dot * s.scale;
                mx = std::max(mx, w[t]);
            }
            double sum = 0;
            for (int32_t t = t0; t < n; ++t) sum += (w[t] = std::exp(w[t] - mx));
            float* o = out + i * ldo + static_cast<int64_t>(h) * s.head_dim;
            for (int d = 0; d < s.head_dim; ++d) {
                double acc = 0;
                for (int32_t t = t0; t < n; ++t) acc += w[t] * value(kv.v, t, g, d);
                o[d] = static_cast<float>(acc / sum);
            }
        }
    }
}

}  // namespace deltaserve::kernels
