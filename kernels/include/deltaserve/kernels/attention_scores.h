// Attention statistics for the eviction policies (H2O, SnapKV, D2O, KV-Compress), computed
// without materialising the n_q x n probability matrix.
#pragma once

#include <cstdint>

#include "deltaserve/common/thread_pool.h"
#include "deltaserve/kernels/attention.h"

namespace deltaserve::kernels {

// For the new queries i in [first, n_q) (the last n_q entries of the view, as in
// attention()) and every query head h of KV head g: p = softmax(scale * q[i,h] . K_g^T) over
// the entries query i sees, and sums[g][j] += p[j] (power 1: H2O and D2O's accumulated
// attention) or p[j]^2 (power 2: KV-Compress's squared metric). sums[g] holds kv.n_of(g)
// floats. Work is split over KV heads.
void attention_column_sums(const AttentionShape& shape, const KvView& kv, const float* q, int64_t ldq,
                           int32_t n_q, int32_t first, int power, float* const* sums, ThreadPool& pool);

}  // namespace deltaserve::kernels
