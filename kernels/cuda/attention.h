// Device side of attention over a slot-mapped KV view (attention.cu). Plain C++: the backend
// (cuda_backend.cpp) validates the shape, stages the slot lists and owns the scratch; every
// pointer here is device memory.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace deltaserve::kernels::cuda {

// kernels::attention for n_q queries of one or more sequences over one pool: query
// i (at row q_row[i] of q and out) of head h reads KV head g = h / (n_heads / n_kv_heads) of
// its sequence's lists, t = q_table[i] + g: entries [0, list_n[t] - q_back[i]) of the slot
// list slots[list_start[t] ...], q_back[i] being how many of the sequence's queries come
// after it (0 for every query: not causal); entry j's K row is at k + slot * row_stride + g *
// head_stride.
struct AttentionLaunch {
    const uint8_t* k = nullptr;
    const uint8_t* v = nullptr;
    bool f16 = true;  // else fp32
    size_t row_stride = 0;
    size_t head_stride = 0;
    const int32_t* slots = nullptr;
    const int64_t* list_start = nullptr;  // n_kv_heads per sequence
    const int32_t* list_n = nullptr;      // n_kv_heads per sequence, each >= its n_q
    const int64_t* q_row = nullptr;       // per query
    const int32_t* q_table = nullptr;     // per query: its sequence's first list, t
    const int32_t* q_back = nullptr;      // per query
    const float* q = nullptr;
    int64_t ldq = 0;
    float* out = nullptr;
    int64_t ldo = 0;
    int32_t n_q = 0;  // every sequence's; n_q * n_heads <= INT32_MAX
    // > 0: a sliding-window layer's (KvView::window): query i reads only the last `window`
    // of its entries [0, list_n[t] - q_back[i]).
    int32_t window = 0;
    int n_heads = 0;
    int n_kv_heads = 0;
    int head_dim = 0;  // a multiple of 8, <= 256
    float scale = 0.0f;
    // With lse: each (query, head)'s log-sum-exp at lse[i * n_heads + h], i counting the
    // launch's queries (-inf where it saw no entry).
    float* lse = nullptr;
    // Keys split over n_splits blocks of split_keys per (query, head), merged by a second
    // kernel through `partial` (attention_plan).
    int n_splits = 1;
    int32_t split_keys = 0;
    float* partial = nullptr;
};

// How attention_launch splits the keys, and the scratch it needs.
struct AttentionPlan {
    int n_splits = 1;
    int32_t split_keys = 0;
    size_t partial_bytes = 0;  // 0 when n_splits is 1
};
// max_n: the most entries of any KV head.
AttentionPlan attention_plan(int32_t n_q, int n_heads, int head_dim, int32_t max_n);

cudaError_t launch_attention(const AttentionLaunch& args, cudaStream_t stream);

}  // namespace deltaserve::kernels::cuda
