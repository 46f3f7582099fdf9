#include "deltaserve/kernels/deltakv.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <immintrin.h>

#include "cpu_features.h"
#include "deltakv_int4_kernels.h"
#include "deltaserve/common/fp16.h"
#include "deltaserve/common/status.h"
#include "deltaserve/kernels/matmul.h"
#include "simd_math.h"

namespace deltaserve::kernels {

void deltakv_encode_residual(const DeltaKvLayer& w, const float* x, const float* r, int64_t n,
                             float* z, float* scratch, ThreadPool& pool) {
    const int64_t d = w.d(), h = w.w1.rows, m = w.m();
    float* a = scratch;
    float* b = scratch + n * h;
    std::vector<float> ez(static_cast<size_t>(n * m));
    for (int pass = 0; pass < 2; ++pass) {
        const float* in = pass == 0 ? x : r;
        const MatmulOutput ab[] = {{&w.w1, a, h}, {&w.w2, b, h}};
        matmul_shared_input(ab, in, d, n, pool);
        for (int64_t i = 0; i < n * h; ++i) a[i] = a[i] / (1.0f + std::exp(-a[i])) * b[i];
        matmul(w.w3, a, h, n, pass == 0 ? z : ez.data(), m, pool);
    }
    for (int64_t i = 0; i < n * m; ++i) z[i] -= ez[i];
}

void deltakv_decode(const DeltaKvLayer& w, const float* z, const float* r, float* out) {
    const int d = w.d(), m = w.m();
    const auto* wd = static_cast<const float*>(w.wd.data);
    for (int i = 0; i < d; ++i) {
        const float* row = wd + static_cast<size_t>(i) * m;
        float acc = 0.0f;
        for (int j = 0; j < m; ++j) acc += row[j] * z[j];
        out[i] = acc + r[i];
    }
}

int l2_nearest(const float* x, const float* cands, int n, int d, int k, int32_t* out) {
    k = std::min(k, n);
    std::vector<std::pair<float, int32_t>> dist(static_cast<size_t>(n));
    for (int c = 0; c < n; ++c) dist[c] = {dot8<true>(x, cands + static_cast<size_t>(c) * d, d), c};
    std::partial_sort(dist.begin(), dist.begin() + k, dist.end());
    for (int i = 0; i < k; ++i) out[i] = dist[i].second;
    return k;
}

Int4Decoder make_int4_decoder(const DeltaKvLayer& w) { return make_int4_decoder(w, w.d()); }

Int4Decoder make_int4_decoder(const DeltaKvLayer& w, int rows) {
    DS_CHECK(w.wd.type == DType::kF32, "the DeltaKV decoder must be fp32");
    DS_CHECK(rows > 0 && rows <= w.d(), "decoder rows out of range");
    Int4Decoder dec;
    dec.d = rows;
    dec.m = w.m();
    dec.m16 = int4_code_stride(dec.m);
    dec.w.assign(static_cast<size_t>(dec.m16) * dec.d, 0);
    dec.scale.resize(static_cast<size_t>(dec.d));
    dec.row_sum.resize(static_cast<size_t>(dec.d));
    const auto* wd = static_cast<const float*>(w.wd.data);
    for (int r = 0; r < dec.d; ++r) {
        const float* row = wd + static_cast<size_t>(r) * dec.m;
        float amax = 0.0f;
        double sum = 0.0;
        for (int j = 0; j < dec.m; ++j) {
            amax = std::max(amax, std::fabs(row[j]));
            sum += row[j];
        }
        dec.scale[r] = amax / 127.0f;
        dec.row_sum[r] = static_cast<float>(sum);
        const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        for (int j = 0; j < dec.m; ++j) {
            dec.w[(static_cast<size_t>(j / 4) * dec.d + r) * 4 + j % 4] =
                static_cast<int8_t>(std::clamp(std::lround(row[j] * inv), -127L, 127L));
        }
    }
    return dec;
}

void int4_decoder_rows(const Int4Decoder& dec, const int32_t* rows, int n_rows, Int4Decoder& out) {
    out.d = n_rows;
    out.m = dec.m;
    out.m16 = dec.m16;
    out.w.resize(static_cast<size_t>(dec.m16) * n_rows);
    out.scale.resize(static_cast<size_t>(n_rows));
    out.row_sum.resize(static_cast<size_t>(n_rows));
    for (int i = 0; i < n_rows; ++i) {
        const int r = rows[i];
        DS_CHECK(r >= 0 && r < dec.d, "decoder row out of range");
        out.scale[i] = dec.scale[r];
        out.row_sum[i] = dec.row_sum[r];
        for (int j4 = 0; j4 < dec.m16 / 4; ++j4) {
            std::memcpy(out.w.data() + (static_cast<size_t>(j4) * n_rows + i) * 4,
                        dec.w.data() + (static_cast<size_t>(j4) * dec.d + r) * 4, 4);
        }
    }
}

void int4_dots_avx2(const Int4DecoderRef& dec, const uint8_t* codes, int64_t n, int32_t* acc) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t i = 0; i < n; ++i) {
        const uint8_t* q = codes + i * dec.m16;
        int32_t* out = acc + i * dec.d;
        int r = 0;
        for (; r + 32 <= dec.d; r += 32) {
            __m256i a[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                            _mm256_setzero_si256()};
            const int8_t* w = dec.w + static_cast<size_t>(r) * 4;
            for (int j4 = 0; j4 < dec.m16 / 4; ++j4, w += static_cast<size_t>(dec.d) * 4) {
                int32_t q4;
                std::memcpy(&q4, q + 4 * j4, 4);
                const __m256i qb = _mm256_set1_epi32(q4);
                for (int b = 0; b < 4; ++b) {
                    // codes <= 15 and |w| <= 127: the pairwise 16-bit sums cannot saturate
                    const __m256i p = _mm256_maddubs_epi16(
                        qb, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32 * b)));
                    a[b] = _mm256_add_epi32(a[b], _mm256_madd_epi16(p, ones));
                }
            }
            for (int b = 0; b < 4; ++b)
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r + 8 * b), a[b]);
        }
        int4_dots_rows(dec, q, r, out);
    }
}

void int4_codes(const uint8_t* packed, int m, uint8_t* q) {
    // Sixteen packed bytes (low nibble first) to 32 codes at a time.
    const __m128i nib = _mm_set1_epi8(15);
    int j = 0;
    for (; j + 32 <= m; j += 32) {
        const __m128i p = _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed + j / 2));
        const __m128i lo = _mm_and_si128(p, nib), hi = _mm_and_si128(_mm_srli_epi16(p, 4), nib);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + j), _mm_unpacklo_epi8(lo, hi));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + j + 16), _mm_unpackhi_epi8(lo, hi));
    }
    for (; j + 1 < m; j += 2) {
        q[j] = packed[j / 2] & 15;
        q[j + 1] = packed[j / 2] >> 4;
    }
    if (m % 2) q[m - 1] = packed[m / 2] & 15;
}

namespace {

using CodesFn = void (*)(const uint8_t* packed, int m, uint8_t* codes);

CodesFn codes_fn() {
    static const CodesFn f = cpu_features().avx512bw ? int4_codes_avx512 : int4_codes;
    return f;
}

void prefetch_bytes(const uint8_t* p, int bytes) {
    for (int b = 0; b < bytes; b += 64)
        _mm_prefetch(reinterpret_cast<const char*>(p + b), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(p + bytes - 1), _MM_HINT_T0);
}

}  // namespace

void int4_latent_codes(const uint8_t* const* latents, int64_t n, int m, uint8_t* codes) {
    const CodesFn unpack = codes_fn();
    const int stride = int4_code_stride(m);
    const int bytes = static_cast<int>(int4_bytes(m));
    constexpr int64_t kAhead = 8;  // the latents lie far apart: ask for later ones early
    for (int64_t i = 0; i < std::min(n, kAhead); ++i) prefetch_bytes(latents[i], bytes);
    for (int64_t i = 0; i < n; ++i) {
        if (i + kAhead < n) prefetch_bytes(latents[i + kAhead], bytes);
        uint8_t* q = codes + i * stride;
        unpack(latents[i] + 4, m, q);
        if (stride > m) std::memset(q + m, 0, static_cast<size_t>(stride - m));
    }
}

namespace {

// Token i's references (Int4KeyFinish) into rows, in order; returns how many.
int finish_rows(const Int4KeyFinish& f, int64_t i, const float** rows) {
    int nr = 0;
    for (int q = 0; q < f.k; ++q) {
        if (f.refs[i * f.k + q] != nullptr) rows[nr++] = f.refs[i * f.k + q];
    }
    return nr;
}

}  // namespace

void deltakv_decode_int4(const Int4DecoderRef& dec, const uint8_t* const* latents, int64_t n,
                         float* out, int64_t ldo, const uint8_t* given,
                         const Int4KeyFinish* finish) {
    static const Int4DotsFn dots = cpu_features().avx512_vnni ? int4_dots_avx512 : int4_dots_avx2;
    DS_CHECK(finish == nullptr || (finish->k <= 16 && finish->n_heads * finish->head_dim <= dec.d),
             "bad Int4KeyFinish");
    // The references' mean and RoPE on the row while it is in registers, where AVX-512 and
    // the shapes allow.
    const bool fused = finish != nullptr && cpu_features().avx512f && dec.d % 16 == 0 &&
                       finish->head_dim % 16 == 0 && finish->style == RopeStyle::kInterleaved;
    constexpr int64_t kBlock = 16;
    thread_local std::vector<uint8_t> codes;
    thread_local std::vector<int32_t> acc;
    const CodesFn unpack = codes_fn();
    if (given == nullptr) codes.assign(static_cast<size_t>(kBlock * dec.m16), 0);
    acc.resize(static_cast<size_t>(kBlock * dec.d));
    for (int64_t b = 0; b < n; b += kBlock) {
        const int64_t e = std::min(n, b + kBlock);
        if (given == nullptr) {
            for (int64_t i = b; i < e; ++i)
                unpack(latents[i] + 4, dec.m, codes.data() + (i - b) * dec.m16);
        }
        dots(dec, given != nullptr ? given + b * dec.m16 : codes.data(), e - b, acc.data());
        for (int64_t i = b; i < e; ++i) {
            uint16_t s16, lo16;
            std::memcpy(&s16, latents[i], 2);
            std::memcpy(&lo16, latents[i] + 2, 2);
            const float s = fp16_to_fp32(s16), lo = fp16_to_fp32(lo16);
            const int32_t* a = acc.data() + (i - b) * dec.d;
            float* y = out + i * ldo;
            const float* rows[16];
            const int nr = finish != nullptr ? finish_rows(*finish, i, rows) : 0;
            const float* c = finish != nullptr ? finish->angles[i] : nullptr;
            if (fused) {
                int4_finish_avx512(dec, a, s, lo, rows, nr, c, c + finish->head_dim / 2,
                                   finish->n_heads * finish->head_dim, finish->head_dim, y);
                continue;
            }
            const __m256 sv = _mm256_set1_ps(s), lov = _mm256_set1_ps(lo);
            int r = 0;
            for (; r + 8 <= dec.d; r += 8) {
                const __m256 v =
                    _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + r)));
                const __m256 w = _mm256_mul_ps(sv, _mm256_loadu_ps(dec.scale + r));
                _mm256_storeu_ps(
                    y + r,
                    _mm256_fmadd_ps(w, v, _mm256_mul_ps(lov, _mm256_loadu_ps(dec.row_sum + r))));
            }
            for (; r < dec.d; ++r)
                y[r] = lo * dec.row_sum[r] + s * dec.scale[r] * static_cast<float>(a[r]);
            if (finish != nullptr) {
                add_mean_rows(y, rows, nr, dec.d);
                rope_apply(y, finish->n_heads, finish->head_dim, c, c + finish->head_dim / 2,
                           finish->style, false);
            }
        }
    }
}

void add_mean_rows(float* x, const float* const* rows, int n, int dims) {
    if (n <= 0) return;
    const float inv = 1.0f / static_cast<float>(n);
    const __m256 iv = _mm256_set1_ps(inv);
    int t = 0;
    for (; t + 8 <= dims; t += 8) {
        __m256 sum = _mm256_loadu_ps(rows[0] + t);
        for (int q = 1; q < n; ++q) sum = _mm256_add_ps(sum, _mm256_loadu_ps(rows[q] + t));
        _mm256_storeu_ps(x + t, _mm256_fmadd_ps(sum, iv, _mm256_loadu_ps(x + t)));
    }
    for (; t < dims; ++t) {
        float sum = rows[0][t];
        for (int q = 1; q < n; ++q) sum += rows[q][t];
        x[t] += sum * inv;
    }
}

void max_head_scores(const float* q, int n_heads, int n_kv_heads, int head_dim,
                     const uint16_t* const* k_rows, int64_t n, float* out, ThreadPool& pool) {
    const int group = n_heads / n_kv_heads;
    pool.parallel_for(n, 64, [&](int64_t b, int64_t e) {
        std::vector<float> k(static_cast<size_t>(n_kv_heads) * head_dim);
        for (int64_t t = b; t < e; ++t) {
            const int kv = n_kv_heads * head_dim;
            int i = 0;
            for (; i + 8 <= kv; i += 8) {
                _mm256_storeu_ps(k.data() + i,
                                 _mm256_cvtph_ps(_mm_loadu_si128(
                                     reinterpret_cast<const __m128i*>(k_rows[t] + i))));
            }
            for (; i < kv; ++i) k[i] = fp16_to_fp32(k_rows[t][i]);
            float best = -INFINITY;
            for (int h = 0; h < n_heads; ++h) {
                best =
                    std::max(best, dot8<false>(q + static_cast<size_t>(h) * head_dim,
                                               k.data() + static_cast<size_t>(h / group) * head_dim,
                                               head_dim));
            }
            out[t] = best;
        }
    });
}

void attention_mass(const float* q, int64_t ldq, int n_q, const float* shift, int n_heads,
                    int n_kv_heads, int head_dim, float scale, const uint16_t* const* k_rows,
                    int64_t n, float* out, ThreadPool& pool) {
    const int group = n_heads / n_kv_heads, rows = n_q * n_heads;
    // Each row's query and the offset of its KV head's K in a converted row; eight rows at a
    // time go in at 2i (i < 4) or 2(i - 4) + 1, so their sums come back in row order.
    const int batched = head_dim % 16 == 0 ? rows / 8 * 8 : 0;
    std::vector<const float*> qrows(static_cast<size_t>(rows));
    std::vector<size_t> koff(static_cast<size_t>(rows)), ooff(static_cast<size_t>(rows));
    for (int r = 0; r < rows; ++r) {
        const int at = r / 8 * 8 + (r % 8 < 4 ? 2 * (r % 8) : 2 * (r % 8 - 4) + 1);
        const size_t row = static_cast<size_t>(r < batched ? at : r);
        qrows[row] = q + (r / n_heads) * ldq + static_cast<int64_t>(r % n_heads) * head_dim;
        koff[row] = static_cast<size_t>(r % n_heads / group) * head_dim;
        ooff[static_cast<size_t>(r)] = static_cast<size_t>(r % n_heads) * static_cast<size_t>(n);
    }
    pool.parallel_for(n, 64, [&](int64_t b, int64_t e) {
        const int kv = n_kv_heads * head_dim;
        std::vector<float> k(static_cast<size_t>(kv)), logit(static_cast<size_t>(rows + 7) / 8 * 8);
        const float* krows[8];
        for (int64_t t = b; t < e; ++t) {
            int i = 0;
            for (; i + 8 <= kv; i += 8) {
                _mm256_storeu_ps(k.data() + i,
                                 _mm256_cvtph_ps(_mm_loadu_si128(
                                     reinterpret_cast<const __m128i*>(k_rows[t] + i))));
            }
            for (; i < kv; ++i) k[i] = fp16_to_fp32(k_rows[t][i]);
            // Eight rows at a time: dot8's bits, one horizontal reduction for the eight.
            for (int r = 0; r < batched; r += 8) {
                for (int j = 0; j < 8; ++j) krows[j] = k.data() + koff[static_cast<size_t>(r + j)];
                alignas(32) float dots[8];
                _mm256_store_ps(dots, dot8_rows8(qrows.data() + r, krows, head_dim));
                for (int j = 0; j < 8; ++j) logit[r + j] = scale * dots[j] + shift[r + j];
            }
            for (int r = batched; r < rows; ++r) {
                logit[r] = scale * dot8<false>(qrows[static_cast<size_t>(r)],
                                               k.data() + koff[static_cast<size_t>(r)], head_dim) +
                           shift[r];
            }
            for (int r = rows; r < static_cast<int>(logit.size()); ++r) logit[r] = -INFINITY;
            for (size_t r = 0; r < logit.size(); r += 8)
                _mm256_storeu_ps(logit.data() + r, exp256(_mm256_loadu_ps(logit.data() + r)));
            for (int r = 0; r < rows; ++r) out[ooff[static_cast<size_t>(r)] + t] += logit[r];
        }
    });
}

size_t int4_bytes(int m) { return static_cast<size_t>((m + 1) / 2) + 4; }

void int4_pack(const float* z, int m, uint8_t* out) {
    float lo = z[0], hi = z[0];
    for (int i = 1; i < m; ++i) {
        lo = std::min(lo, z[i]);
        hi = std::max(hi, z[i]);
    }
    const uint16_t lo16 = fp32_to_fp16(lo);
    const float lo_r = fp16_to_fp32(lo16);
    const uint16_t s16 = fp32_to_fp16((hi - lo_r) / 15.0f);
    const float s = fp16_to_fp32(s16);
    const float inv = s > 0.0f ? 1.0f / s : 0.0f;
    std::memcpy(out, &s16, 2);
    std::memcpy(out + 2, &lo16, 2);
    uint8_t* q = out + 4;
    std::memset(q, 0, static_cast<size_t>((m + 1) / 2));
    for (int i = 0; i < m; ++i) {
        const int v = std::clamp(static_cast<int>(std::lround((z[i] - lo_r) * inv)), 0, 15);
        q[i / 2] |= static_cast<uint8_t>(i % 2 == 0 ? v : v << 4);
    }
}

void int4_unpack(const uint8_t* in, int m, float* z) {
    uint16_t s16, lo16;
    std::memcpy(&s16, in, 2);
    std::memcpy(&lo16, in + 2, 2);
    const float s = fp16_to_fp32(s16), lo = fp16_to_fp32(lo16);
    const uint8_t* q = in + 4;
    // Sixteen codes (eight bytes, low nibble first) at a time: z = lo + s * code, fused.
    const __m256 sv = _mm256_set1_ps(s), lov = _mm256_set1_ps(lo);
    const __m128i nib = _mm_set1_epi8(15);
    int i = 0;
    for (; i + 16 <= m; i += 16) {
        const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + i / 2));
        const __m128i codes =
            _mm_unpacklo_epi8(_mm_and_si128(b, nib), _mm_and_si128(_mm_srli_epi16(b, 4), nib));
        _mm256_storeu_ps(z + i,
                         _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(codes)), sv, lov));
        _mm256_storeu_ps(
            z + i + 8,
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(codes, 8))), sv,
                            lov));
    }
    for (; i < m; ++i)
        z[i] = std::fma(s, static_cast<float>(i % 2 == 0 ? q[i / 2] & 15 : q[i / 2] >> 4), lo);
}

void rope_angles(int64_t pos, int head_dim, float base, float* c, float* s) {
    const float theta_scale = std::pow(base, -2.0f / static_cast<float>(head_dim));
    float theta = static_cast<float>(pos);
    for (int j = 0; j < head_dim / 2; ++j) {
        c[j] = std::cos(theta);
        s[j] = std::sin(theta);
        theta *= theta_scale;
    }
}

void rope_apply(float* x, int n_heads, int head_dim, const float* c, const float* s,
                RopeStyle style, bool inverse) {
    const int half = head_dim / 2;
    const float sign = inverse ? -1.0f : 1.0f;
    // Eight values at a time: (a, b) -> (a c - b s, a s + b c), s negated for the inverse.
    const __m256 sgn = _mm256_set1_ps(sign);
    for (int hd = 0; hd < n_heads; ++hd) {
        float* v = x + static_cast<int64_t>(hd) * head_dim;
        int j = 0;
        if (style == RopeStyle::kInterleaved) {
            // Pairs are neighbours: duplicate each angle into both lanes of its pair.
            const __m256i dup = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
            const __m256 alt = _mm256_setr_ps(-1, 1, -1, 1, -1, 1, -1, 1);
            for (; j + 4 <= half; j += 4) {
                const __m256 cc =
                    _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(c + j)), dup);
                const __m256 ss = _mm256_mul_ps(
                    _mm256_mul_ps(
                        _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(s + j)), dup),
                        alt),
                    sgn);
                const __m256 ab = _mm256_loadu_ps(v + 2 * j);
                const __m256 ba = _mm256_permute_ps(ab, 0xB1);
                _mm256_storeu_ps(v + 2 * j, _mm256_fmadd_ps(ba, ss, _mm256_mul_ps(ab, cc)));
            }
        } else {
            for (; j + 8 <= half; j += 8) {
                const __m256 cc = _mm256_loadu_ps(c + j),
                             ss = _mm256_mul_ps(_mm256_loadu_ps(s + j), sgn);
                const __m256 a = _mm256_loadu_ps(v + j), b = _mm256_loadu_ps(v + j + half);
                _mm256_storeu_ps(v + j, _mm256_fnmadd_ps(b, ss, _mm256_mul_ps(a, cc)));
                _mm256_storeu_ps(v + j + half, _mm256_fmadd_ps(b, cc, _mm256_mul_ps(a, ss)));
            }
        }
        for (; j < half; ++j) {
            const int i0 = style == RopeStyle::kInterleaved ? 2 * j : j;
            const int i1 = style == RopeStyle::kInterleaved ? 2 * j + 1 : j + half;
            const float a = v[i0], b = v[i1], sj = sign * s[j];
            v[i0] = a * c[j] - b * sj;
            v[i1] = a * sj + b * c[j];
        }
    }
}

void rope_inverse(float* x, int n_heads, int head_dim, int64_t pos, float base, RopeStyle style) {
    // RoPE at -pos is not the exact inverse in float (the angles round differently); rotate
    // by the same angles the forward RoPE used, the other way.
    std::vector<float> c(static_cast<size_t>(head_dim / 2)), s(c.size());
    rope_angles(pos, head_dim, base, c.data(), s.data());
    rope_apply(x, n_heads, head_dim, c.data(), s.data(), style, true);
}

}  // namespace deltaserve::kernels
