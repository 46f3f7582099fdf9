// Causal attention over a KV cache addressed through a position -> slot map.
#pragma once

#include <cstddef>
#include <cstdint>

#include "deltaserve/common/thread_pool.h"
#include "deltaserve/kernels/dtype.h"

namespace deltaserve::kernels {

// What attention reads for one layer of one sequence: K and V rows live in slot-indexed
// pools (row_stride bytes apart); entry i of the view is in slot slots[i]. K is stored after
// RoPE, so entries need not be consecutive positions: a compressed cache lists the tokens
// it kept, in position order, and the new tokens last.
//
// KV head g of a row is at byte g * head_stride. With per-head lists, KV head g reads its
// own entries head_slots[g][0, head_n[g]) (policies that keep different tokens per head;
// their rows hold one head each and head_stride steps from one head's arena to the next).
//
// A sliding-window layer's view (Gemma 3's local layers) sets `window`: a causal query then
// sees at most the `window` entries that end at its own (llama.cpp's LLAMA_SWA_TYPE_STANDARD:
// key position p0 is visible to query position p1 when p1 - p0 < window), the entries being
// consecutive positions. 0: no window.
struct KvView {
    DType dtype = DType::kF16;  // kF16 or kF32
    const uint8_t* k = nullptr;
    const uint8_t* v = nullptr;
    size_t row_stride = 0;
    const int32_t* slots = nullptr;
    int32_t n = 0;  // entries
    size_t head_stride = 0;
    const int32_t* const* head_slots = nullptr;
    const int32_t* head_n = nullptr;
    int32_t window = 0;

    const int32_t* slots_of(int g) const { return head_slots != nullptr ? head_slots[g] : slots; }
    int32_t n_of(int g) const { return head_n != nullptr ? head_n[g] : n; }
    size_t head_offset(int g) const { return static_cast<size_t>(g) * head_stride; }
};

struct AttentionShape {
    int n_heads = 0;
    int n_kv_heads = 0;  // query head h reads KV head h / (n_heads / n_kv_heads)
    int head_dim = 0;    // a multiple of 8, at most 256
    float scale = 0.0f;  // usually 1 / sqrt(head_dim)
};

// For n_q new queries, the last n_q entries of the view (query i sees the entries before
// the new ones and new ones up to itself): out[i] = softmax(scale * q[i] K^T) V per head.
// q and out are [n_q][n_heads * head_dim] with row strides ldq / ldo (floats). Work is split
// over heads, query blocks and, for short query runs over long contexts, over key ranges
// merged at the end. With lse, also the log of each row's softmax denominator,
// lse[i * n_heads + h] = log sum_j exp(scale * q[i, h] . k_j), so that attention over other
// entries can be merged in (merge_attention).
// Without `causal`, every query sees every entry of the view (none of them its own), and the
// window does not apply.
void attention(const AttentionShape& shape, const KvView& kv, const float* q, int64_t ldq,
               int32_t n_q, float* out, int64_t ldo, ThreadPool& pool, float* lse = nullptr,
               bool causal = true);

// Attention of the same rows over two disjoint sets of entries, each normalised over its own
// set with its lse, made into attention over both: out and lse (n_rows x head_dim and n_rows)
// become the merged result.
void merge_attention(float* out, float* lse, const float* out_b, const float* lse_b, int n_rows,
                     int head_dim);

// The same attention with the rounding of llama.cpp's CPU flash attention (ggml built for
// AVX-512, fp16 KV cache, positions in cells 0..n-1), so that deltaserve can reproduce
// llama.cpp's outputs token for token. It follows llama.cpp's per-batch choice of path: a
// tiled fp32 path for batches of 64+ queries; otherwise one query row at a time with Q and the
// output accumulator rounded to fp16, the cells of a one-token batch over 512+ (padded)
// cells split into n_split chunks (llama.cpp's thread count) merged in order. Slower than
// attention(). Requires an fp16 cache holding every position: entry p is position p, and
// the queries are at positions p0 .. p0 + n_q - 1. With a window, the masked entries are
// skipped as ggml skips a -inf mask (a window cache's first entry is then position p0 -
// (kv.n - n_q), not 0; only the distances matter).
void attention_ggml(const AttentionShape& shape, const KvView& kv, const float* q, int64_t ldq,
                    int32_t n_q, int32_t p0, float* out, int64_t ldo, int n_split,
                    ThreadPool& pool);

// The straightforward implementation (one query, one head at a time), for tests.
void attention_reference(const AttentionShape& shape, const KvView& kv, const float* q, int64_t ldq,
                         int32_t n_q, float* out, int64_t ldo);

}  // namespace deltaserve::kernels
