// Attention with the rounding of llama.cpp's CPU flash attention (see attention.h,
// attention_ggml). Every step below mirrors one of ggml-cpu's (ops.cpp, vec.h) as built
// for AVX-512 without FP16 arithmetic: 16-lane vectors, four accumulators per dot product,
// fp16 conversions with round-to-nearest-even, the same fused multiply-adds and summation
// trees. The code is ours and uses AVX2: each lane of a 16-lane ggml vector maps to a lane
// of one of two 8-lane halves, and lane-wise arithmetic rounds identically on either ISA.
// This file is compiled without floating-point contraction (ISO C++), so a plain a * b + c
// rounds twice and only the explicit fma / _mm256_fmadd_ps fuse.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "deltaserve/common/status.h"
#include "deltaserve/kernels/attention.h"
#include "simd_math.h"

namespace deltaserve::kernels {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kMaxDim = 256;
constexpr int kTile = 64;           // ggml's GGML_FA_TILE_KV (keys per tile in the tiled path)
constexpr int32_t kQTile = 64;      // GGML_FA_TILE_Q: batches this long take the tiled path
constexpr int32_t kPad = 256;       // llama.cpp pads the KV cells it attends over to this
constexpr int32_t kSplitMin = 512;  // from this many cells, one-token batches split the cells

float h2f(uint16_t h) { return _cvtsh_ss(h); }
uint16_t f2h(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }
__m256 load_h8(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
void store_h8(uint16_t* p, __m256 v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}

// _mm512_reduce_add_ps as GCC implements it: halves, then quarters, then pairs.
float reduce16(const float* v) {
    float t3[8], t6[4];
    for (int i = 0; i < 8; ++i) t3[i] = v[8 + i] + v[i];
    for (int i = 0; i < 4; ++i) t6[i] = t3[4 + i] + t3[i];
    return (t6[0] + t6[2]) + (t6[1] + t6[3]);
}

// ggml_vec_dot_f16: four 16-lane fp32 accumulators over 64-element steps, combined lane-wise
// as (a0 + a2) + (a1 + a3), reduced across lanes; leftover elements added in double.
float dot_f16(const uint16_t* x, const uint16_t* y, int n) {
    const int np = n & ~63;
    __m256 acc[8];  // acc[2j] and acc[2j + 1]: low and high halves of ggml's sum[j]
    for (auto& a : acc) a = _mm256_setzero_ps();
    for (int i = 0; i < np; i += 64) {
        for (int h = 0; h < 8; ++h)
            acc[h] = _mm256_fmadd_ps(load_h8(x + i + 8 * h), load_h8(y + i + 8 * h), acc[h]);
    }
    alignas(32) float s[16];
    _mm256_store_ps(s, _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6])));
    _mm256_store_ps(s + 8,
                    _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7])));
    double sum = reduce16(s);
    for (int i = np; i < n; ++i) sum += static_cast<double>(h2f(x[i]) * h2f(y[i]));
    return static_cast<float>(sum);
}

// ggml_vec_scale_f16 and ggml_vec_mad_f16: fp32 arithmetic, stored back as fp16.
void scale_f16(uint16_t* y, float v, int n) {
    const __m256 vv = _mm256_set1_ps(v);
    int i = 0;
    for (; i + 8 <= n; i += 8) store_h8(y + i, _mm256_mul_ps(load_h8(y + i), vv));
    for (; i < n; ++i) y[i] = f2h(h2f(y[i]) * v);
}
void mad_f16(uint16_t* y, const uint16_t* x, float v, int n) {
    const __m256 vv = _mm256_set1_ps(v);
    int i = 0;
    for (; i + 8 <= n; i += 8) store_h8(y + i, _mm256_fmadd_ps(load_h8(x + i), vv, load_h8(y + i)));
    for (; i < n; ++i) y[i] = f2h(std::fma(h2f(x[i]), v, h2f(y[i])));
}

void scale_f32(float* y, float v, int n) {
    for (int i = 0; i < n; ++i) y[i] *= v;
}

struct Rows {
    const AttentionShape& s;
    const KvView& kv;
    const uint16_t* k(int32_t pos, int g) const { return row(kv.k, pos, g); }
    const uint16_t* v(int32_t pos, int g) const { return row(kv.v, pos, g); }
    const uint16_t* row(const uint8_t* base, int32_t pos, int g) const {
        return reinterpret_cast<const uint16_t*>(
            base + static_cast<size_t>(kv.slots[pos]) * kv.row_stride + kv.head_offset(g));
    }
};

// Online-softmax state of one (query, head) row over a run of cells.
struct RowState {
    float m = kNegInf;
    float s = 0.0f;
};

// ggml_compute_forward_flash_attn_ext_f16_one_chunk for one row over cells [c0, c1), all
// visible: Q rounded to fp16, K.Q in fp16 dot products, the output accumulated in fp16.
// Leaves the unnormalised output in o (fp32).
RowState one_chunk(const Rows& r, int g, const uint16_t* q16, int32_t c0, int32_t c1, float* o) {
    const int dim = r.s.head_dim;
    alignas(32) uint16_t acc[kMaxDim] = {};
    RowState st;
    for (int32_t c = c0; c < c1; ++c) {
        const float score = dot_f16(r.k(c, g), q16, dim) * r.s.scale;
        const float m_old = st.m;
        float ms = 1.0f, vs = 1.0f;
        if (score > st.m) {
            st.m = score;
            ms = std::exp(m_old - st.m);
            scale_f16(acc, ms, dim);
        } else {
            vs = std::exp(score - st.m);
        }
        mad_f16(acc, r.v(c, g), vs, dim);
        st.s = std::fma(st.s, ms, vs);
    }
    for (int d = 0; d < dim; ++d) o[d] = h2f(acc[d]);
    return st;
}

// ggml_vec_soft_max_f32 over one tile row: y = exp(x - m) (ggml_v_expf), and the sum
// accumulated in double from 16-lane partial sums.
double softmax_tile(float* x, float m) {
    double sum = 0.0;
    const __m256 mv = _mm256_set1_ps(m);
    for (int i = 0; i < kTile; i += 16) {
        _mm256_storeu_ps(x + i, exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv)));
        _mm256_storeu_ps(x + i + 8, exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), mv)));
        sum += static_cast<double>(reduce16(x + i));
    }
    return sum;
}

// ggml_compute_forward_flash_attn_ext_tiled for one row at position pos: fp32 Q, keys in
// tiles of 64 cells, scores and values accumulated by single fused multiply-add chains.
// Cells before `lo` are masked (a window's).
void tiled_row(const Rows& r, int g, const float* q, int32_t lo, int32_t pos, int32_t n_cells,
               float* o) {
    const int dim = r.s.head_dim;
    alignas(32) float kq[kTile];
    alignas(32) float vbuf[kMaxDim];
    float m = kNegInf, s = 0.0f;
    std::fill(o, o + dim, 0.0f);
    for (int32_t t0 = lo / kTile * kTile; t0 < n_cells && t0 <= pos; t0 += kTile) {
        const int visible = std::min<int32_t>(kTile, pos - t0 + 1);
        const int first = std::max<int32_t>(0, lo - t0);
        for (int j = 0; j < kTile; ++j) {
            if (j >= visible || j < first) {
                kq[j] = kNegInf;
                continue;
            }
            const uint16_t* k = r.k(t0 + j, g);
            float acc = 0.0f;
            for (int d = 0; d < dim; ++d) acc = std::fma(q[d], h2f(k[d]), acc);
            kq[j] = acc * r.s.scale;
        }
        float tile_max = kNegInf;
        for (int j = 0; j < kTile; ++j) tile_max = std::max(tile_max, kq[j]);
        const float m_new = std::fmax(m, tile_max);
        if (m_new > m) {
            const float ms = std::exp(m - m_new);
            scale_f32(o, ms, dim);
            s *= ms;
        }
        m = m_new;
        s = static_cast<float>(static_cast<double>(s) + softmax_tile(kq, m_new));
        for (int j = first; j < visible; ++j) {
            const uint16_t* v = r.v(t0 + j, g);
            for (int d = 0; d < dim; d += 8) _mm256_storeu_ps(vbuf + d, load_h8(v + d));
            const __m256 p = _mm256_set1_ps(kq[j]);
            for (int d = 0; d < dim; d += 8) {
                _mm256_storeu_ps(
                    o + d, _mm256_fmadd_ps(p, _mm256_loadu_ps(vbuf + d), _mm256_loadu_ps(o + d)));
            }
        }
    }
    scale_f32(o, s == 0.0f ? 0.0f : 1.0f / s, dim);
}

// The one-token path over many cells: ggml splits the cells in n_split equal chunks (one per
// thread), runs one_chunk on each, and merges the partial states in chunk order.
void split_row(const Rows& r, int g, const uint16_t* q16, int32_t lo, int32_t pos, int32_t n_cells,
               int n_split, float* o) {
    const int dim = r.s.head_dim;
    const int32_t chunk = (n_cells + n_split - 1) / n_split;
    alignas(32) float part[kMaxDim];
    float m = kNegInf, s = 0.0f;
    std::fill(o, o + dim, 0.0f);
    for (int i = 0; i < n_split; ++i) {
        const int32_t c0 = i * chunk;
        if (c0 >= n_cells || c0 + chunk <= lo) continue;
        const RowState st =
            one_chunk(r, g, q16, std::max(c0, lo), std::min({c0 + chunk, n_cells, pos + 1}), part);
        if (st.s == 0.0f) continue;
        const float m_new = std::fmax(m, st.m);
        const float scale_old = std::exp(m - m_new);
        const float scale_new = std::exp(st.m - m_new);
        for (int d = 0; d < dim; ++d) o[d] = std::fma(o[d], scale_old, part[d] * scale_new);
        s = std::fma(s, scale_old, st.s * scale_new);
        m = m_new;
    }
    if (s != 0.0f) scale_f32(o, 1.0f / s, dim);
}

}  // namespace

void attention_ggml(const AttentionShape& s, const KvView& kv, const float* q, int64_t ldq,
                    int32_t n_q, int32_t p0, float* out, int64_t ldo, int n_split,
                    ThreadPool& pool) {
    DS_CHECK(kv.head_slots == nullptr && kv.dtype == DType::kF16 &&
                 (kv.window > 0 ? n_q <= kv.n : p0 + n_q <= kv.n),
             "llama.cpp-compatible attention needs an fp16 cache of every position");
    // Cells are the view's entries: position p0 at cell p0 of a cache of every position, and a
    // window cache's entries starting where it holds them.
    if (kv.window > 0) p0 = kv.n - n_q;
    const int group = s.n_heads / s.n_kv_heads;
    const int dim = s.head_dim;
    const int32_t n_cells = std::max(kPad, (p0 + n_q + kPad - 1) / kPad * kPad);
    const bool split = n_q == 1 && n_cells >= kSplitMin;
    const bool tiled = n_q >= kQTile;
    const Rows rows{s, kv};
    const int64_t items = static_cast<int64_t>(n_q) * s.n_heads;
    pool.parallel_for(items, 1, [&](int64_t b, int64_t e) {
        alignas(32) uint16_t q16[kMaxDim];
        for (int64_t it = b; it < e; ++it) {
            const int32_t i = static_cast<int32_t>(it / s.n_heads);
            const int h = static_cast<int>(it % s.n_heads);
            const int g = h / group;
            const int32_t pos = p0 + i;
            const int32_t lo = kv.window > 0 ? std::max(0, pos - kv.window + 1) : 0;
            const float* qh = q + i * ldq + static_cast<int64_t>(h) * dim;
            float* o = out + i * ldo + static_cast<int64_t>(h) * dim;
            if (tiled) {
                tiled_row(rows, g, qh, lo, pos, n_cells, o);
                continue;
            }
            for (int d = 0; d < dim; ++d) q16[d] = f2h(qh[d]);
            if (split) {
                split_row(rows, g, q16, lo, pos, n_cells, n_split, o);
                continue;
            }
            const RowState st = one_chunk(rows, g, q16, lo, pos + 1, o);
            scale_f32(o, st.s == 0.0f ? 0.0f : 1.0f / st.s, dim);
        }
    });
}

}  // namespace deltaserve::kernels
