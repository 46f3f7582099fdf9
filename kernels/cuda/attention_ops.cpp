// Host side of attention on the "cuda" backend: the views' checks, their slot lists and
// per-query tables staged in one copy, one launch per pool.
#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "attention.h"
#include "forward_ops.h"
#include "op_status.h"
#include "stream_buffer.h"

namespace deltaserve::kernels::cuda {

namespace {

bool same_pool(const KvView& a, const KvView& b) {
    return a.k == b.k && a.v == b.v && a.dtype == b.dtype && a.row_stride == b.row_stride &&
           a.head_stride == b.head_stride && a.window == b.window;
}

// Jobs over one pool (same_pool), checked, as one launch; lse and not causal: one job.
Status attention_one_launch(const AttentionShape& s, std::span<const AttentionJob> jobs,
                            const float* q, int64_t ldq, float* out, int64_t ldo,
                            cudaStream_t stream, float* lse = nullptr, bool causal = true) {
    const int n_groups = s.n_kv_heads;
    int64_t n_q = 0;
    int32_t max_n = 0;
    for (const AttentionJob& j : jobs) {
        n_q += j.n_q;
        for (int g = 0; g < n_groups; ++g) max_n = std::max(max_n, j.view.n_of(g));
    }
    if (n_q == 0) return Status();
    // Staged as one copy: the int64s (each sequence's KV heads' list starts, each query's
    // row), then the int32s (the lists' lengths, each query's table and count of the
    // sequence's queries after it, the lists: a list shared by a sequence's heads once).
    const size_t tables = jobs.size() * static_cast<size_t>(n_groups);
    std::vector<int64_t> wide(tables + static_cast<size_t>(n_q));
    std::vector<int32_t> lens(tables), per_query(2 * static_cast<size_t>(n_q)), slots;
    size_t qi = 0;
    for (size_t b = 0; b < jobs.size(); ++b) {
        const KvView& kv = jobs[b].view;
        const size_t t0 = b * static_cast<size_t>(n_groups);
        for (int g = 0; g < n_groups; ++g) {
            lens[t0 + g] = kv.n_of(g);
            if (kv.head_slots == nullptr && g > 0) {
                wide[t0 + g] = wide[t0];
                continue;
            }
            wide[t0 + g] = static_cast<int64_t>(slots.size());
            slots.insert(slots.end(), kv.slots_of(g), kv.slots_of(g) + kv.n_of(g));
        }
        for (int32_t i = 0; i < jobs[b].n_q; ++i, ++qi) {
            wide[tables + qi] = jobs[b].first_row + i;
            per_query[qi] = static_cast<int32_t>(t0);
            per_query[static_cast<size_t>(n_q) + qi] = causal ? jobs[b].n_q - 1 - i : 0;
        }
    }
    const size_t wide_bytes = wide.size() * sizeof(int64_t);
    const size_t lens_bytes = lens.size() * sizeof(int32_t);
    const size_t per_query_bytes = per_query.size() * sizeof(int32_t);
    std::vector<uint8_t> staged(wide_bytes + lens_bytes + per_query_bytes +
                                slots.size() * sizeof(int32_t));
    uint8_t* at = staged.data();
    for (const auto& [src, bytes] : {std::pair<const void*, size_t>{wide.data(), wide_bytes},
                                     {lens.data(), lens_bytes},
                                     {per_query.data(), per_query_bytes},
                                     {slots.data(), slots.size() * sizeof(int32_t)}}) {
        if (bytes > 0) std::memcpy(at, src, bytes);
        at += bytes;
    }
    DS_ASSIGN_OR_RETURN(StreamBuffer d_staged,
                        StreamBuffer::copy_of(staged.data(), staged.size(), stream));
    const auto* d_wide = d_staged.as<int64_t>();
    const auto* d_narrow = reinterpret_cast<const int32_t*>(d_staged.as<uint8_t>() + wide_bytes);

    const AttentionPlan plan =
        attention_plan(static_cast<int32_t>(n_q), s.n_heads, s.head_dim, max_n);
    DS_ASSIGN_OR_RETURN(StreamBuffer partial, StreamBuffer::create(plan.partial_bytes, stream));
    const KvView& kv = jobs[0].view;
    AttentionLaunch a;
    a.k = kv.k;
    a.v = kv.v;
    a.f16 = kv.dtype == DType::kF16;
    a.row_stride = kv.row_stride;
    a.head_stride = kv.head_stride;
    a.list_start = d_wide;
    a.q_row = d_wide + tables;
    a.list_n = d_narrow;
    a.q_table = d_narrow + tables;
    a.q_back = a.q_table + n_q;
    a.slots = a.q_back + n_q;
    a.q = q;
    a.ldq = ldq;
    a.out = out;
    a.ldo = ldo;
    a.n_q = static_cast<int32_t>(n_q);
    a.window = causal ? kv.window : 0;
    a.n_heads = s.n_heads;
    a.n_kv_heads = s.n_kv_heads;
    a.head_dim = s.head_dim;
    a.scale = s.scale;
    a.n_splits = plan.n_splits;
    a.split_keys = plan.split_keys;
    a.partial = partial.as<float>();
    a.lse = lse;
    return launched(launch_attention(a, stream), "attention");
}

// The checks of every view; causal views need an entry per query at least.
Status check_jobs(const AttentionShape& s, std::span<const AttentionJob> jobs, const float* q,
                  int64_t ldq, const float* out, int64_t ldo, bool causal, bool* one_pool) {
    const char* op = "attention";
    if (s.head_dim <= 0 || s.head_dim % 8 != 0 || s.head_dim > 256) {
        return invalid(
            op, "head_dim must be a multiple of 8 in [8, 256], got " + std::to_string(s.head_dim));
    }
    if (s.n_heads <= 0 || s.n_kv_heads <= 0 || s.n_heads % s.n_kv_heads != 0) {
        return invalid(op, "n_heads must be a positive multiple of n_kv_heads");
    }
    const int64_t width = static_cast<int64_t>(s.n_heads) * s.head_dim;
    if (ldq < width || ldo < width) return invalid(op, "ldq and ldo must be >= n_heads * head_dim");
    int64_t n_q = 0;
    *one_pool = true;
    for (const AttentionJob& j : jobs) {
        const KvView& kv = j.view;
        if (kv.dtype != DType::kF16 && kv.dtype != DType::kF32) {
            return invalid(op, "the KV cache must be F16 or F32");
        }
        if (j.n_q < 0 || j.first_row < 0) return invalid(op, "n_q or first_row < 0");
        n_q += j.n_q;
        if (n_q * s.n_heads > kMaxRows) return invalid(op, "n_q * n_heads > 2^31 - 1");
        if (j.n_q == 0) continue;
        if (q == nullptr || out == nullptr || kv.k == nullptr || kv.v == nullptr) {
            return invalid(op, "a null pointer");
        }
        for (int g = 0; g < s.n_kv_heads; ++g) {
            if (causal && kv.n_of(g) < j.n_q) {
                return invalid(op, "KV head " + std::to_string(g) + " has " +
                                       std::to_string(kv.n_of(g)) + " entries, fewer than the " +
                                       std::to_string(j.n_q) + " queries");
            }
            if (kv.slots_of(g) == nullptr) return invalid(op, "a null slot list");
        }
        *one_pool = *one_pool && same_pool(kv, jobs[0].view);
    }
    return Status();
}

}  // namespace

Status run_attention_batch(const AttentionShape& s, std::span<const AttentionJob> jobs,
                           const float* q, int64_t ldq, float* out, int64_t ldo,
                           cudaStream_t stream) {
    bool one_pool = true;
    DS_RETURN_IF_ERROR(check_jobs(s, jobs, q, ldq, out, ldo, /*causal=*/true, &one_pool));
    if (one_pool) return attention_one_launch(s, jobs, q, ldq, out, ldo, stream);
    for (size_t b = 0; b < jobs.size(); ++b) {  // views of several pools: one launch each
        DS_RETURN_IF_ERROR(attention_one_launch(s, jobs.subspan(b, 1), q, ldq, out, ldo, stream));
    }
    return Status();
}

Status run_attention(const AttentionShape& s, const KvView& kv, const float* q, int64_t ldq,
                     int32_t n_q, float* out, int64_t ldo, cudaStream_t stream) {
    const AttentionJob job{kv, 0, n_q};
    return run_attention_batch(s, std::span<const AttentionJob>(&job, 1), q, ldq, out, ldo, stream);
}

Status run_attention_lse(const AttentionShape& s, const KvView& kv, const float* q, int64_t ldq,
                         int32_t n_q, float* out, int64_t ldo, float* lse, bool causal,
                         cudaStream_t stream) {
    const AttentionJob job{kv, 0, n_q};
    const std::span<const AttentionJob> jobs(&job, 1);
    bool one_pool = true;
    DS_RETURN_IF_ERROR(check_jobs(s, jobs, q, ldq, out, ldo, causal, &one_pool));
    if (n_q > 0 && lse == nullptr) return invalid("attention_lse", "no lse");
    return attention_one_launch(s, jobs, q, ldq, out, ldo, stream, lse, causal);
}

}  // namespace deltaserve::kernels::cuda
