// The transformer forward pass, written for a batch of sequences (DESIGN.md "The forward
// pass"): each sequence brings its own cache and its new tokens (1 when decoding, a chunk
// when prefilling); the new tokens of all sequences are processed as one matrix.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "deltaserve/common/status.h"
#include "deltaserve/common/thread_pool.h"
#include "deltaserve/kernels/attention.h"
#include "deltaserve/kernels/backend.h"
#include "deltaserve/kernels/matmul.h"
#include "deltaserve/kvstore/kv_cache.h"
#include "deltaserve/model/backend_weights.h"
#include "deltaserve/model/model.h"

namespace deltaserve::model {

// What sampling needs of a sequence's logits row when the row is not brought over whole
// (Sampler::candidates_wanted and penalized): its `top` largest and the logits of `also`.
struct CandidateWant {
    int32_t top = 0;  // 0: the whole row
    std::span<const int32_t> also;
};

// A row's candidates: the largest logits first (ties: the lower id first), then `also`'s.
struct RowCandidates {
    std::vector<int32_t> ids;
    std::vector<float> logits;
};

struct SequenceInput {
    kvstore::SequenceCache* cache = nullptr;
    std::span<const int32_t> tokens;  // new tokens, appended after cache->n_tokens()
    bool all_logits = false;          // logits for every new token, not only the last
    // With all_logits false, on a device backend, and run() given a place for them: the
    // row's candidates instead of the whole row (Backend::top_k on the device; the rest of
    // the row never comes over).
    CandidateWant want;
};

// How the forward pass rounds: kNative is deltaserve's own attention and matmul order
// (kernels::DotOrder::kBlock); kGgml reproduces llama.cpp's CPU flash attention
// (kernels::attention_ggml) and vec_dot order (DotOrder::kGgml) bit for bit, for
// token-for-token comparisons.
enum class AttentionNumerics { kNative, kGgml };

// Called after each layer with the layer index (the prefill worker ships from here).
using LayerObserver = std::function<void(int32_t layer)>;

// Sees each layer's new K (before RoPE) and V: n rows of kv_dim floats, ld floats apart
// (calibration records DeltaKV's training data from here).
using KvTap =
    std::function<void(int32_t layer, const float* k, const float* v, int64_t n, int64_t ld)>;

// Sees what each layer's attention starts from: the normed hidden states (ldh floats apart),
// Q and K after RoPE (ldq / ldk apart), for n new tokens (calibration of TRIM-KV's gates).
using AttentionTap =
    std::function<void(int32_t layer, const float* hidden, int64_t ldh, const float* q, int64_t ldq,
                       const float* k, int64_t ldk, int64_t n)>;

// The forward pass's dense ops (norms, matmuls, RoPE, SwiGLU, the embedding and the logits,
// attention over a cache's view) go through a kernels::Backend: the CPU backend's are the
// kernels themselves. The activations live in the backend's memory, the weights as the
// backend holds them (BackendWeights). A cache on the backend's device (full KV's block pool
// there) takes its rows there and is attended there. A cache in host memory (the compressing
// and evicting policies) gets, on a device backend, host copies of each layer's new Q, K, V
// and normed rows; its attention runs on the CPU backend, and its output goes back.
class Forward {
  public:
    // backend: nullptr for the CPU backend. Its weights are made at the first run().
    Forward(const Model& model, ThreadPool& pool, kernels::Backend* backend = nullptr);

    // Runs the batch through every layer and appends the new tokens to their caches.
    // Logits go to `logits` as rows of n_vocab: for each sequence in order, its last token
    // or all its tokens. Errors (nothing is appended to any cache): kInvalidArgument for an
    // empty sequence or an out-of-vocabulary token, kResourceExhausted when a cache cannot
    // take the tokens; the backend's (its memory, a weight it cannot hold).
    // With `candidates` (one entry per sequence), a sequence that wants candidates
    // (SequenceInput::want) on a device backend gets them there, and its logits row is left
    // unwritten; the others' entries are empty.
    Status run(std::span<const SequenceInput> batch, std::vector<float>& logits,
               std::vector<RowCandidates>* candidates = nullptr);

    void set_layer_observer(LayerObserver observer) { observer_ = std::move(observer); }
    void set_kv_tap(KvTap tap) { kv_tap_ = std::move(tap); }
    void set_attention_tap(AttentionTap tap) { attention_tap_ = std::move(tap); }
    void set_attention_numerics(AttentionNumerics numerics) { numerics_ = numerics; }

  private:
    kernels::DotOrder dot_order() const {
        return numerics_ == AttentionNumerics::kGgml ? kernels::DotOrder::kGgml
                                                     : kernels::DotOrder::kBlock;
    }
    kernels::Exec exec(ThreadPool& pool) const { return {&pool, dot_order(), nullptr}; }
    bool on_host() const { return backend_.host_memory(); }
    Status ensure_scratch(int64_t n_tokens);
    // The embedding, every layer and the logits (run() commits or gives back the caches).
    Status layers(std::span<const SequenceInput> batch, int64_t n_tokens,
                  std::vector<float>& logits, std::vector<RowCandidates>* candidates);
    // The logits rows (n_out of them, in logits_) to the host: whole, or as candidates for the
    // sequences that want them.
    Status logits_out(std::span<const SequenceInput> batch, int64_t n_out,
                      std::vector<float>& logits, std::vector<RowCandidates>* candidates);
    Status attention_layer(int32_t layer, std::span<const SequenceInput> batch);
    // A layer's rows for the caches: Q and K after RoPE, V, the normed hidden states and the
    // attention output ([n_tokens][width] each).
    struct LayerRows {
        const float* q = nullptr;
        const float* k = nullptr;
        const float* v = nullptr;
        const float* xn = nullptr;
        float* attn = nullptr;
    };
    // The caches' part of a layer: stores, attention, observation. `rows` in the backend's
    // memory, for caches on its device; `host` their host copies, for caches in host memory
    // (the same on the CPU backend).
    Status attend_caches(int32_t layer, std::span<const SequenceInput> batch, const LayerRows& rows,
                         const LayerRows& host);
    Status ffn_layer(int32_t layer, int64_t n_tokens);
    Status norm_rows(const float* weight, const float* in, float* out, int64_t n_rows);
    // `n` floats of the backend's memory at `src` in host memory: `src` itself on the CPU
    // backend, else copied into `host`.
    Result<const float*> to_host(const float* src, int64_t n, std::vector<float>& host);
    // One host cache's attention over its view (the caches that do not attend themselves), on
    // `pool`.
    struct ViewAttention {
        kernels::KvView view;
        const float* q = nullptr;
        float* out = nullptr;
        int32_t n = 0;           // new tokens
        int32_t n_past = 0;      // tokens before them
        bool on_device = false;  // the view is in the backend's memory (a device cache)
    };
    Status attend_view(const ViewAttention& job, ThreadPool& pool);

    const Model& model_;
    const ModelConfig& cfg_;
    ThreadPool& pool_;
    kernels::Backend& backend_;
    kernels::Backend& cpu_;  // the caches' attention on a device backend
    std::shared_ptr<const BackendWeights> weights_;
    LayerObserver observer_;
    KvTap kv_tap_;
    AttentionTap attention_tap_;
    AttentionNumerics numerics_ = AttentionNumerics::kNative;
    std::vector<int32_t> positions_;   // absolute position of every new token
    std::vector<int64_t> first_row_;   // a batch's sequences' first rows in the scratch
    std::vector<size_t> steps_;        // the batch's one-token sequences
    std::vector<Status> step_status_;  // each sequence's attention, this layer
    std::vector<kernels::AttentionJob> device_jobs_;  // the device caches' views, this layer
    bool host_caches_ = false;                        // this run has caches in host memory
    ThreadPool one_thread_{1};  // a decode step's sequences share pool_, each on one thread
    // Scratch in the backend's memory, [n_tokens][width] each, and the logits' rows.
    kernels::Buffer x_, xn_, q_, k_, v_, attn_, tmp_, gate_, up_, logits_, also_;
    // Candidates on their way to the host: every row's largest, and `also`'s logits.
    std::vector<int32_t> top_ids_, gather_;  // gather_: `also`'s offsets in logits_
    std::vector<float> top_values_, also_values_;
    int64_t capacity_ = 0;
    // On a device backend, host copies of a layer's rows for the caches and taps.
    std::vector<float> host_q_, host_k_, host_v_, host_xn_, host_attn_;
};

}  // namespace deltaserve::model
