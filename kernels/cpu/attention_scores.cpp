#include "deltaserve/kernels/attention_scores.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "deltaserve/common/status.h"

namespace deltaserve::kernels {

namespace {

float dot_row(const float* q, const uint8_t* row, int dim, DType dtype) {
    __m256 acc = _mm256_setzero_ps();
    for (int d = 0; d < dim; d += 8) {
        const __m256 k = dtype == DType::kF16
                             ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * d)))
                             : _mm256_loadu_ps(reinterpret_cast<const float*>(row) + d);
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), k, acc);
    }
    alignas(32) float t[8];
    _mm256_store_ps(t, acc);
    return ((t[0] + t[4]) + (t[1] + t[5])) + ((t[2] + t[6]) + (t[3] + t[7]));
}

}  // namespace

void attention_column_sums(const AttentionShape& s, const KvView& kv, const float* q, int64_t ldq, int32_t n_q,
                           int32_t first, int power, float* const* sums, ThreadPool& pool) {
    DS_CHECK(s.head_dim % 8 == 0 && (power == 1 || power == 2), "attention_column_sums: bad arguments");
    const int group = s.n_heads / s.n_kv_heads;
    pool.parallel_for(s.n_kv_heads, 1, [&](int64_t b, int64_t e) {
        std::vector<float> p;
        for (int g = static_cast<int>(b); g < static_cast<int>(e); ++g) {
            const int32_t* slots = kv.slots_of(g);
            const int32_t p0 = kv.n_of(g) - n_q;
            p.resize(static_cast<size_t>(kv.n_of(g)));
            float* out = sums[g];
            for (int32_t i = std::max(0, first); i < n_q; ++i) {
                const int32_t visible = p0 + i + 1;
                for (int hh = 0; hh < group; ++hh) {
                    const float* qh = q + i * ldq + static_cast<int64_t>(g * group + hh) * s.head_dim;
                    float mx = -INFINITY;
                    for (int32_t j = 0; j < visible; ++j) {
                        const uint8_t* row = kv.k + static_cast<size_t>(slots[j]) * kv.row_stride + kv.head_offset(g);
                        p[j] = dot_row(qh, row, s.head_dim, kv.dtype) * s.scale;
                        mx = std::max(mx, p[j]);
                    }
                    double total = 0;
                    for (int32_t j = 0; j < visible; ++j) total += (p[j] = std::exp(p[j] - mx));
                    const float inv = static_cast<float>(1.0 / total);
                    for (int32_t j = 0; j < visible; ++j) {
                        const float w = p[j] * inv;
                        out[j] += power == 1 ? w : w * w;
                    }
                }
            }
        }
    });
}

}  // namespace deltaserve::kernels
