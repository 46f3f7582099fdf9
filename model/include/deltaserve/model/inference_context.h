// An inference context: a model, a thread pool and the KV cache of its sequences.
//
// The forward pass underneath is written for a batch of sequences; this class is the
// convenient single-sequence surface the CLI, the tests and the benchmarks use.
// Not thread-safe: one caller at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "deltaserve/common/status.h"
#include "deltaserve/kernels/backend.h"
#include "deltaserve/kvstore/block_pool.h"
#include "deltaserve/kvstore/deltakv_cache.h"
#include "deltaserve/kvstore/eviction_policy.h"
#include "deltaserve/model/forward.h"
#include "deltaserve/model/model.h"

namespace deltaserve::model {

enum class KvType {
    kF16,  // default: half the bytes, what llama.cpp stores
    kF32,
};

struct ContextOptions {
    // Maximum tokens in the sequence. Default 0: the model's training context, capped at
    // 8192.
    int32_t n_ctx = 0;
    // Threads, counting the caller. Default 0: one per hardware thread.
    int n_threads = 0;
    // Prompt tokens processed per forward call (chunked prefill). Default: 512.
    int32_t n_batch = 512;
    // KV cache element type. Default: kF16.
    KvType kv_type = KvType::kF16;
    // Attention arithmetic. kGgml (llama.cpp's rounding, needs kv_type kF16) reproduces
    // llama.cpp's outputs token for token when both run with the same thread count.
    AttentionNumerics attention = AttentionNumerics::kNative;
    // Where the forward pass's dense ops run (kernels::choose_backend). Default nullptr: the
    // CPU backend. kGgml numerics need the CPU.
    kernels::Backend* backend = nullptr;
    // KV cache policy and keep ratio. Default: "full" (every token, no eviction).
    kvstore::EvictionConfig kv;
    // The compression profile the deltakv policy (deltakv.json) or trimkv (trimkv.json) needs.
    std::string kv_profile;
    // deltakv: which layers keep full attention (1 per layer); empty = chosen from kv.keep
    // and the profile's sensitivity order. Calibration measures sensitivity with it.
    std::vector<uint8_t> deltakv_full_layers;
    // deltakv: share of the compressed tokens a decode step attends to and reconstructs, in
    // (0, 1] (the paper's rho). More is closer to full KV and slower; memory is the same.
    float deltakv_select = 0.1f;
    // deltakv: every how many sparse layers a scorer picks that share with its own keys
    // (kvstore::DeltaKvOptions::score_every); 0 = the paper's observation-layer pick.
    int32_t deltakv_score_every = 0;
    // deltakv: the share of key dimensions a scorer's first pass uses, in (0, 1]
    // (kvstore::DeltaKvOptions::score_dims); 1 = whole keys for every token.
    float deltakv_score_dims = 0.25f;
    // deltakv: the share of the compressed tokens a chunk's last queries attended most, which
    // every decode step after it attends besides its own pick, in [0, 1)
    // (kvstore::DeltaKvOptions::pin_ratio); 0 = off.
    float deltakv_pin = 0.1f;
    // deltakv: how many latent tokens a decode step attended most the next step attends
    // again, with the few after each, besides its own pick (kvstore::DeltaKvOptions::follow);
    // 0 = off.
    int32_t deltakv_follow = 16;
    // deltakv: the share of compressed tokens kept exact instead, those their latents
    // reconstruct worst (kvstore::DeltaKvOptions::exact_share), in [0, 1); 0 = off.
    float deltakv_exact = 0.0f;
    // deltakv: the share of the sparse layers, the first ones, whose errors choose them
    // (kvstore::DeltaKvOptions::exact_depth), in (0, 1].
    float deltakv_exact_depth = 0.5f;
    // A thread pool to share with other contexts (a decode worker batches many sequences
    // through one pool: eval_batch). Default: the context makes its own of n_threads.
    std::shared_ptr<ThreadPool> threads;
    // The node's KV block pool (kvstore::BlockPool) for the full policy: a worker's contexts
    // draw their blocks from one pool, whose capacity is the node's KV budget, and share a
    // prefix's blocks. Default: the context makes its own of n_ctx tokens. Other policies
    // keep their own pools.
    std::shared_ptr<kvstore::BlockPool> kv_blocks;
    // The deltakv policy's profile, loaded once and shared by many contexts (a worker's
    // sessions). Default: loaded from kv_profile. (trimkv's gates share through kv.gates.)
    std::shared_ptr<const kvstore::DeltaKvProfile> deltakv_profile;
};

class InferenceContext {
  public:
    // Errors: kInvalidArgument for options the model cannot take.
    static Result<std::unique_ptr<InferenceContext>> create(const Model& model,
                                                            const ContextOptions& options);
    virtual ~InferenceContext() = default;

    // Appends tokens to the sequence (chunked by n_batch) and returns the logits of the last
    // one (n_vocab floats, valid until the next call). Errors: kOutOfRange when the sequence
    // would exceed n_ctx (nothing is appended), kInvalidArgument for an empty span or a
    // token id outside the vocabulary.
    virtual Result<std::span<const float>> eval(std::span<const int32_t> tokens) = 0;

    // As eval, but returns the logits of every appended token (tokens.size() x n_vocab):
    // scoring (perplexity, calibration), so each chunk of n_batch is scored against the history
    // as a compressing cache holds it after the chunks before it (no expect_more).
    virtual Result<std::vector<float>> eval_all(std::span<const int32_t> tokens) = 0;
    // A prompt fed in several calls: the next forward call on this context (eval, eval_batch,
    // a BatchRunner's run) will be followed by n_more tokens of the same prompt before any is
    // sampled (kvstore::SequenceCache::expect_more). One eval's own chunks of n_batch tell the
    // cache themselves; eval_all ignores it.
    virtual void expect_more(int32_t n_more) = 0;

    // Tokens in the sequence so far.
    virtual int32_t n_past() const = 0;
    virtual int32_t n_ctx() const = 0;
    // Empties the sequence (its KV slots return to the pool).
    virtual void reset() = 0;
    // Keeps the first n_keep tokens and drops the rest (n_keep <= n_past()).
    virtual void truncate(int32_t n_keep) = 0;
    // How many positions truncate(n_keep) keeps: n_keep, or 0 where the cache's sliding-window
    // layers no longer hold the window that ends at n_keep (the turn then recomputes).
    virtual int32_t kept_by_truncate(int32_t n_keep) const { return n_keep; }
    // Bytes the KV cache holds for the sequence, and their ratio to the bytes of the same
    // tokens in an fp16 cache that keeps everything (1 for "full" with an fp16 cache).
    virtual size_t kv_bytes() const = 0;
    virtual double keep_ratio() const = 0;
    // Bytes of memory the KV cache holds: kv_bytes() and what its allocation leaves unused
    // (a paged cache's last block; kvstore::SequenceCache::held_bytes).
    virtual size_t kv_held_bytes() const = 0;
    // The most kv_held_bytes() can reach with n_tokens tokens (capped at n_ctx): what a
    // worker books for a turn before admitting it (kvstore::SequenceCache::bytes_bound).
    virtual size_t kv_bytes_bound(int32_t n_tokens) const = 0;
    // What kv_held_bytes() may reach beyond that while the last n_new of the n_tokens are
    // prefilled (kvstore::SequenceCache::prefill_bytes_bound): booked for the prefill only.
    virtual size_t kv_prefill_bytes_bound(int32_t n_tokens, int32_t n_new) const = 0;
    // Paged KV (the full policy): the block pool, the blocks of the first n_blocks *
    // kBlockTokens tokens, and taking such blocks of another context on the same pool into an
    // empty one (kvstore::SequenceCache::blocks / adopt_blocks: with sliding-window layers,
    // several ids per position block, one per layer group). Null, empty and kUnimplemented
    // for other policies.
    virtual const kvstore::BlockPool* kv_block_pool() const = 0;
    virtual std::vector<int32_t> kv_blocks(int32_t n_blocks) const = 0;
    virtual Status adopt_kv_blocks(std::span<const int32_t> blocks) = 0;

    virtual const Model& model() const = 0;
    // The sequence's KV for shipping to another node, in the cache's own representation
    // (kvstore::SequenceCache::export_state / export_layer), and taking it back into an
    // empty context made with the same options (import_kv_state, then every layer).
    virtual Result<std::vector<uint8_t>> export_kv_state() const = 0;
    virtual Result<std::vector<uint8_t>> export_kv_layer(int32_t layer) const = 0;
    virtual Status import_kv_state(std::span<const uint8_t> state) = 0;
    virtual Status import_kv_layer(int32_t layer, std::span<const uint8_t> part) = 0;
    // What the last chunk left for the decode steps after it (kvstore::SequenceCache::
    // export_hints), shipped after every layer; empty when none.
    virtual std::vector<uint8_t> export_kv_hints() const = 0;
    virtual Status import_kv_hints(std::span<const uint8_t> hints) = 0;
    // Layer-wise shipping (kvstore::SequenceCache::export_rows): whether the cache ships
    // rows while the forward pass runs; how far a layer's rows are final (from the layer
    // observer, or at rest) while more tokens may come, or, with `last`, in the call whose
    // tokens are the last (kvstore::SequenceCache::rows_final_end); the state an importer takes
    // before the rows of n_tokens positions; the rows of positions [begin, end), and taking such
    // ranges back after import_kv_state.
    virtual bool kv_ships_rows() const = 0;
    virtual int32_t kv_rows_final_end(int32_t layer, bool last = false) const = 0;
    virtual Result<std::vector<uint8_t>> export_kv_rows_state(int32_t n_tokens) const = 0;
    virtual Result<std::vector<uint8_t>> export_kv_rows(int32_t layer, int32_t begin,
                                                        int32_t end) const = 0;
    virtual Status import_kv_rows(int32_t layer, int32_t begin, int32_t end,
                                  std::span<const uint8_t> part) = 0;
    // Per layer, the reconstruction error of positions [begin, end) measured when they were
    // compressed (kvstore::SequenceCodec::rows_error); empty when the cache keeps them exact.
    virtual std::vector<float> kv_rows_error(int32_t begin, int32_t end) const = 0;
    // Layer `layer`'s [K; V] rows (K before RoPE; 2 * kv_dim floats a position) of
    // `positions` as the cache gives them to attention, and whether each is a latent (1), or
    // 2 for a window layer's row past its window, not held
    // (kvstore::DeltaKvSequenceCache::attended_rows). Errors: kFailedPrecondition for other
    // caches than DeltaKV's, kOutOfRange for a position or layer the cache does not hold.
    virtual Status kv_attended_rows(int32_t layer, std::span<const int32_t> positions,
                                    std::vector<float>* rows, std::vector<uint8_t>* latent) = 0;
    // Called after each layer of every forward pass with the layer index, while the chunk's
    // positions [n_past(), n_past() + chunk) are stored but not yet committed.
    virtual void set_layer_observer(LayerObserver observer) = 0;
    // Sees every layer's new K (before RoPE) and V as they are computed (calibration).
    virtual void set_kv_tap(KvTap tap) = 0;
    // Sees every layer's attention inputs after RoPE (calibration of TRIM-KV's gates).
    virtual void set_attention_tap(AttentionTap tap) = 0;
};

// Continuous batching: appends tokens[i] to contexts[i] for every i in one forward pass (one
// token for a sequence that decodes, a chunk of its prompt for one that prefills) and writes
// the logits of each context's last new token to `logits` (contexts.size() rows of n_vocab).
// The contexts must be distinct, made from the same model with the same attention numerics,
// and share one thread pool (ContextOptions::threads). Errors (nothing is appended to any
// context): kOutOfRange when a context would overflow, kInvalidArgument for mismatched or
// empty inputs, kResourceExhausted.
Status eval_batch(std::span<InferenceContext* const> contexts,
                  std::span<const std::span<const int32_t>> tokens, std::vector<float>& logits);

class Forward;

// eval_batch through scratch of its own: a worker that batches whichever sessions are running
// makes one, so the batch's activations (tokens x the model's widths) live once in the
// worker, not in every context that once came first in a batch. Layer observers and taps of
// the contexts are not called.
class BatchRunner {
  public:
    BatchRunner(const Model& model, std::shared_ptr<ThreadPool> threads, AttentionNumerics numerics,
                kernels::Backend* backend = nullptr);
    ~BatchRunner();

    // As eval_batch; the contexts must also share this runner's model, pool, numerics and
    // backend.
    Status run(std::span<InferenceContext* const> contexts,
               std::span<const std::span<const int32_t>> tokens, std::vector<float>& logits);
    // The same, where wants[i] asks for context i's row as candidates (Forward::run): on a
    // device backend those rows stay there and candidates[i] holds what sampling needs of
    // them (logits' row i unwritten); elsewhere every row comes whole, candidates[i] empty.
    Status run(std::span<InferenceContext* const> contexts,
               std::span<const std::span<const int32_t>> tokens,
               std::span<const CandidateWant> wants, std::vector<float>& logits,
               std::vector<RowCandidates>& candidates);
    // The same, where all_logits[i] != 0 (or all_logits empty: none) gives context i a row
    // for each of its new tokens, in order, before the next context's rows (its wants[i] is
    // then not used): what reporting a prompt's log-probabilities needs.
    Status run(std::span<InferenceContext* const> contexts,
               std::span<const std::span<const int32_t>> tokens,
               std::span<const CandidateWant> wants, std::span<const uint8_t> all_logits,
               std::vector<float>& logits, std::vector<RowCandidates>& candidates);

    const Model& model() const { return model_; }
    const ThreadPool* threads() const { return threads_.get(); }
    AttentionNumerics numerics() const { return numerics_; }
    const kernels::Backend* backend() const { return backend_; }

  private:
    const Model& model_;
    std::shared_ptr<ThreadPool> threads_;
    AttentionNumerics numerics_;
    kernels::Backend* backend_;
    std::unique_ptr<Forward> forward_;
};

}  // namespace deltaserve::model
