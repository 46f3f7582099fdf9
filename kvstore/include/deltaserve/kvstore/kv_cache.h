// The cache interface the forward pass is written against, and its full-precision
// implementation. Compression policies (the DeltaKV issue) implement the same interface.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "deltaserve/common/status.h"
#include "deltaserve/common/thread_pool.h"
#include "deltaserve/kernels/attention.h"
#include "deltaserve/kernels/backend.h"
#include "deltaserve/kvstore/block_pool.h"
#include "deltaserve/kvstore/kv_layer_groups.h"

namespace deltaserve::kvstore {

class SequenceCodec;

// One sequence's KV cache. The forward pass, per chunk of n new tokens:
//   reserve(n)                              once, before the first layer
//   store(layer, ...) then view(layer)      per layer: new K/V in, then what to attend
//   commit(n)                               after the last layer
// Not thread-safe.
class SequenceCache {
  public:
    virtual ~SequenceCache() = default;

    // Positions cached and committed so far.
    virtual int32_t n_tokens() const = 0;
    // Makes room for n_new more positions in every layer.
    // Errors: kResourceExhausted (nothing changes).
    virtual Status reserve(int32_t n_new) = 0;
    // Where the cache's K and V live: nullptr for host memory, else the device backend whose
    // memory holds them. A cache on a device takes the pointers of store, observe and attend
    // in that device's memory (the forward pass's activations), and its view points there.
    virtual kernels::Backend* device() const { return nullptr; }
    // Writes K (after RoPE) and V of positions [n_tokens() + first, ... + n) of a layer; rows
    // of k and v are kv_dim floats, ld floats apart. Errors: the device's (a host cache has
    // none).
    virtual Status store(int32_t layer, int32_t first, int32_t n, const float* k, const float* v,
                         int64_t ld) = 0;
    // What the layer's attention reads: committed positions plus the n_visible_new reserved
    // ones already stored.
    virtual kernels::KvView view(int32_t layer, int32_t n_visible_new) const = 0;
    // Called after a layer's attention with that layer's queries for the new positions
    // (after RoPE; n rows ldq floats apart, all n stored and visible) and the hidden states
    // that entered the attention (after its norm; ldh floats apart): a policy that ranks
    // tokens by attention or by a learned gate gathers its statistics here. Default: nothing.
    // `pool`, here and in attend(): the threads the call may use (the forward pass's, or one
    // thread where it runs a batch's sequences side by side).
    // Errors, here and in attend(): a device's, in a cache whose ops run there; the caller
    // then truncates the cache to n_tokens(), as after any failed forward call.
    virtual Status observe(int32_t layer, const kernels::AttentionShape& shape, const float* q,
                           int64_t ldq, const float* hidden, int64_t ldh, int32_t n,
                           ThreadPool& pool) {
        (void)layer, (void)shape, (void)q, (void)ldq, (void)hidden, (void)ldh, (void)n, (void)pool;
        return Status();
    }
    // A cache that attends a layer itself (DeltaKV's decode steps attend compressed tokens
    // without making their values) does it here, after store(): out = attention of the n new
    // queries (q as attention() takes them) over what the layer holds, and returns true.
    // Default false: the caller attends view(layer, n).
    virtual Result<bool> attend(int32_t layer, const kernels::AttentionShape& shape, const float* q,
                                int64_t ldq, int32_t n, float* out, int64_t ldo, ThreadPool& pool) {
        (void)layer, (void)shape, (void)q, (void)ldq, (void)n, (void)out, (void)ldo, (void)pool;
        return false;
    }
    // Makes n reserved positions part of the sequence (a compressing cache shrinks here).
    // Errors: a device's, in a cache that compresses there; the cache is then as it was
    // before the call, less the reserved positions (n_tokens() unchanged, nothing reserved).
    virtual Status commit(int32_t n) = 0;
    // Chunked prefill: the caller will append n_more positions of the same prompt right after
    // the next forward call's, before any token is sampled. A compressing cache may wait for
    // them and compress the prompt once at its end (DeltaKV: every chunk then attends the
    // prompt exact, and no chunk reconstructs what an earlier one compressed). Holds for the
    // next commit only; truncate forgets it. Default: ignored.
    virtual void expect_more(int32_t n_more) { (void)n_more; }
    // Keeps the first n_keep committed positions (n_keep <= n_tokens()) and gives back every
    // slot past them, reserved ones included: truncate(n_tokens()) undoes a reserve. A cache
    // whose window layers no longer hold the window that ends at n_keep keeps nothing instead
    // (kept_by_truncate says which); truncate(n_tokens()) always keeps every committed one.
    virtual void truncate(int32_t n_keep) = 0;
    // How many positions truncate(n_keep) would keep: n_keep or 0.
    virtual int32_t kept_by_truncate(int32_t n_keep) const { return n_keep; }
    // Bytes this sequence holds: K and V of every layer, and what a compressing cache keeps
    // to find them (slot ids, positions, statistics).
    virtual size_t bytes() const = 0;
    // Bytes of memory the sequence holds: bytes() and what its allocation leaves unused (a
    // paged cache's last block). What a node's budget counts.
    virtual size_t held_bytes() const { return bytes(); }
    // The most held_bytes() can reach with n_tokens positions: what a node books for a turn that
    // may grow to that length before it admits it.
    virtual size_t bytes_bound(int32_t n_tokens) const = 0;
    // What held_bytes() may reach beyond bytes_bound(n_tokens) while the last n_new of those
    // positions are prefilled in chunks (expect_more), until the prompt's last chunk commits:
    // a node books it for the prefill and gives it back after. Default 0.
    virtual size_t prefill_bytes_bound(int32_t n_tokens, int32_t n_new) const {
        (void)n_tokens, (void)n_new;
        return 0;
    }

    // Paged caches (blocks of a BlockPool: full KV) can share their prefixes. blocks(n): the
    // blocks holding the first n * BlockPool::kBlockTokens committed positions (n at most
    // n_tokens() / kBlockTokens), n_groups() per position block (KvLayerGroups: block i of
    // group g at i * n_groups + g; -1 for a window group's block its window left). adopt_blocks:
    // an empty cache on the same pool takes such blocks of another sequence (one more
    // reference each) as its first positions; they stay read-only, a write into one copies it
    // first; a window group's blocks may be -1 except those the window ending at the last of
    // them reaches. Default: no blocks; kUnimplemented.
    virtual const BlockPool* block_pool() const { return nullptr; }
    virtual int32_t n_groups() const { return 1; }
    virtual std::vector<int32_t> blocks(int32_t n_blocks) const {
        (void)n_blocks;
        return {};
    }
    virtual Status adopt_blocks(std::span<const int32_t> blocks) {
        (void)blocks;
        return unimplemented("this KV policy's cache has no blocks to share");
    }

    // How the committed tokens leave this cache and come back (SequenceCodec); null for a
    // cache whose tokens cannot leave it (the per-head eviction caches).
    virtual SequenceCodec* codec() { return nullptr; }
    const SequenceCodec* codec() const { return const_cast<SequenceCache*>(this)->codec(); }
};

// The codec half of a cache: its committed tokens in its own representation, what shipping
// a session between nodes (DESIGN.md "One chat turn") and the tiered store's blocks use,
// where SequenceCache is what the forward pass uses. A cache that has one implements both.
class SequenceCodec {
  public:
    virtual ~SequenceCodec() = default;

    // Shipping a session to another node (DESIGN.md "One chat turn"): the committed tokens
    // as a small session-wide state (how many, which are kept how) and one part per layer,
    // in the cache's own representation (a compressing cache ships what it holds, not full
    // KV). An empty cache of the same kind and settings takes them back exactly:
    // import_state, then import_layer for every layer in any order; until every layer came
    // in, attention over the missing ones reads zeros (safe, but wrong: admit the session
    // after the last one). Export needs no reserved positions. Errors on import:
    // kFailedPrecondition (the cache is not empty or its settings differ), kDataLoss (a part
    // of the wrong size or contents), kResourceExhausted (no room).
    virtual Result<std::vector<uint8_t>> export_state() const = 0;
    virtual Result<std::vector<uint8_t>> export_layer(int32_t layer) const = 0;
    virtual Status import_state(std::span<const uint8_t> state) = 0;
    virtual Status import_layer(int32_t layer, std::span<const uint8_t> part) = 0;
    // What the last chunk left for the decode steps after it (DeltaKV's pins), shipped
    // after the layers so that the importer decodes as the exporter would; empty for a
    // cache that keeps none. import_hints takes them into a cache holding every layer;
    // kDataLoss for hints that do not fit it.
    virtual std::vector<uint8_t> export_hints() const { return {}; }
    virtual Status import_hints(std::span<const uint8_t> hints) {
        return hints.empty() ? Status() : data_loss("decode hints for a cache that keeps none");
    }
    // Layer-wise shipping while the forward pass runs (ships_rows()): from the layer
    // observer, after a layer's store and observe, a cache exports the rows of positions
    // [begin, end) of that layer as they will stay, reserved positions included, for any
    // end <= rows_final_end(layer, last); at rest, rows_final_end(layer) covers what is
    // final while more tokens may come. `last`: this call's tokens are the last ones, so no
    // later call compresses what it leaves. Once the last call returned every stored row is
    // final. An importer that took the rows state takes each layer's ranges in order, layers
    // in any order. Full KV: every stored row is final. DeltaKV: full layers' rows are; a
    // sparse layer's are up to the end of its compressed region after this call's commit
    // (the buffer after it may still be compressed; with `last`, every row), but while the
    // call keeps some of the tokens it compresses exact (exact_share) and not every judging
    // layer has compressed them, only up to the region before the call. Errors as for
    // export_layer / import_layer, and kInvalidArgument for a range outside the cache.
    virtual bool ships_rows() const { return false; }
    virtual int32_t rows_final_end(int32_t layer, bool last = false) const = 0;
    // The state an importer takes before rows of n_tokens positions (sent ahead of them).
    virtual Result<std::vector<uint8_t>> export_rows_state(int32_t n_tokens) const = 0;
    virtual Result<std::vector<uint8_t>> export_rows(int32_t layer, int32_t begin,
                                                     int32_t end) const = 0;
    virtual Status import_rows(int32_t layer, int32_t begin, int32_t end,
                               std::span<const uint8_t> part) = 0;
    // Per layer, what compression cost positions [begin, end) of the committed tokens, as
    // measured when they were compressed (and shipped with them): the relative RMS error of
    // the reconstructed K and V rows over the range's compressed tokens, 0 where it has none,
    // NaN where nothing was measured (layers kept exact). Empty for a cache that keeps
    // everything exact.
    virtual std::vector<float> rows_error(int32_t begin, int32_t end) const {
        (void)begin, (void)end;
        return {};
    }
};

// Bytes of n_tokens tokens in an fp16 cache that keeps everything: the denominator of the
// keep ratio (bytes() / full_fp16_bytes()).
inline size_t full_fp16_bytes(int32_t n_tokens, int32_t n_layers, int32_t kv_dim) {
    return static_cast<size_t>(n_tokens) * static_cast<size_t>(n_layers) *
           static_cast<size_t>(kv_dim) * 2 * 2;
}

// Every token of every layer, in blocks of a BlockPool (kBlockTokens positions each, found
// through the sequence's block tables, one per layer group) at the pool's precision; a
// sliding-window layer's group holds only the blocks its window reaches (KvLayerGroups).
class FullSequenceCache final : public SequenceCache, public SequenceCodec {
  public:
    // max_tokens: positions the sequence may hold at most (its context; a reserve past it is
    // refused, as is an import of more). groups: how the model's layers map to the pool's
    // blocks (default: one group of the pool's layers, no window). max_chunk: the most
    // positions one forward call adds (the context's batch), which bounds a window group's
    // blocks in bytes_bound (a larger reserve still works, past the bound).
    explicit FullSequenceCache(std::shared_ptr<BlockPool> pool,
                               int32_t max_tokens = std::numeric_limits<int32_t>::max(),
                               KvLayerGroups groups = {},
                               int32_t max_chunk = std::numeric_limits<int32_t>::max());
    ~FullSequenceCache() override;
    FullSequenceCache(const FullSequenceCache&) = delete;
    FullSequenceCache& operator=(const FullSequenceCache&) = delete;

    int32_t n_tokens() const override { return n_committed_; }
    // Also copies a shared block the next position falls in (after a truncate into it).
    Status reserve(int32_t n_new) override;
    kernels::Backend* device() const override { return pool_->device(); }
    Status store(int32_t layer, int32_t first, int32_t n, const float* k, const float* v,
                 int64_t ld) override;
    kernels::KvView view(int32_t layer, int32_t n_visible_new) const override;
    Status commit(int32_t n) override;
    void truncate(int32_t n_keep) override;
    int32_t kept_by_truncate(int32_t n_keep) const override;
    // The rows of its positions (reserved ones too) in every layer, a window layer's held
    // ones; held_bytes(): whole blocks, shared ones included.
    size_t bytes() const override;
    size_t held_bytes() const override;
    size_t bytes_bound(int32_t n_tokens) const override;
    const BlockPool* block_pool() const override { return pool_.get(); }
    int32_t n_groups() const override { return groups_.n_groups(); }
    std::vector<int32_t> blocks(int32_t n_blocks) const override;
    Status adopt_blocks(std::span<const int32_t> blocks) override;
    SequenceCodec* codec() override { return this; }
    // State: the token count and the row size (and the window, with window layers). A layer
    // (or a range of its rows): the K rows, then the V rows, at the pool's precision; a window
    // layer's starts with the first position it holds (int32), the rows from there: the
    // window's (a range before the window exports none; an importer takes the rows the
    // window that ends at the state's count reaches, and refuses a part that lacks some).
    Result<std::vector<uint8_t>> export_state() const override;
    Result<std::vector<uint8_t>> export_layer(int32_t layer) const override;
    Status import_state(std::span<const uint8_t> state) override;
    Status import_layer(int32_t layer, std::span<const uint8_t> part) override;
    bool ships_rows() const override { return true; }
    int32_t rows_final_end(int32_t /*layer*/, bool /*last*/) const override { return n_slots_; }
    Result<std::vector<uint8_t>> export_rows_state(int32_t n_tokens) const override;
    Result<std::vector<uint8_t>> export_rows(int32_t layer, int32_t begin,
                                             int32_t end) const override;
    Status import_rows(int32_t layer, int32_t begin, int32_t end,
                       std::span<const uint8_t> part) override;

  private:
    // The block the next position falls in, when other sequences hold it too, becomes a copy
    // of its own (in every group).
    Status own_partial_block();
    // Window groups: gives back the blocks no query from position `from` on reaches.
    void drop_before(int32_t from);
    // The first position a window layer holds.
    int32_t window_first() const { return dropped_ * BlockPool::kBlockTokens; }
    // Position blocks per window group at most, with n_tokens positions (bytes_bound).
    int32_t window_blocks_bound(int32_t n_tokens) const;
    size_t rows_bytes(int32_t n) const { return 2 * pool_->row_bytes() * static_cast<size_t>(n); }

    std::shared_ptr<BlockPool> pool_;
    const int32_t max_tokens_;
    const KvLayerGroups groups_;
    const int32_t max_chunk_;
    // Per group, the block table (block i holds positions [16 i, 16 i + 16); -1: a window
    // group's block given back) and position -> slot (-1 there), committed then reserved.
    std::vector<std::vector<int32_t>> tables_;
    std::vector<std::vector<int32_t>> slots_;
    int32_t n_slots_ = 0;  // positions committed and reserved
    int32_t n_committed_ = 0;
    int32_t dropped_ = 0;  // window groups: blocks [0, dropped_) given back
    // A truncate ended inside a block, which others may hold (the next reserve looks).
    bool partial_ = false;
};

}  // namespace deltaserve::kvstore
