// The cache interface the forward pass is written against, and its full-precision
// implementation. Compression policies (the DeltaKV issue) implement the same interface.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "deltaserve/common/status.h"
#include "deltaserve/kernels/attention.h"
#include "deltaserve/kvstore/slot_pool.h"

namespace deltaserve::kvstore {

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
    // Writes K (after RoPE) and V of positions [n_tokens() + first, ... + n) of a layer; rows
    // of k and v are kv_dim floats, ld floats apart.
    virtual void store(int32_t layer, int32_t first, int32_t n, const float* k, const float* v,
                       int64_t ld) = 0;
    // What the layer's attention reads: committed positions plus the n_visible_new reserved
    // ones already stored.
    virtual kernels::KvView view(int32_t layer, int32_t n_visible_new) const = 0;
    // Called after a layer's attention with that layer's queries for the new positions
    // (after RoPE; n rows ldq floats apart, all n stored and visible) and the hidden states
    // that entered the attention (after its norm; ldh floats apart): a policy that ranks
    // tokens by attention or by a learned gate gathers its statistics here. Default: nothing.
    virtual void observe(int32_t layer, const kernels::AttentionShape& shape, const float* q, int64_t ldq,
                         const float* hidden, int64_t ldh, int32_t n) {
        (void)layer, (void)shape, (void)q, (void)ldq, (void)hidden, (void)ldh, (void)n;
    }
    // A cache that attends a layer itself (DeltaKV's decode steps attend compressed tokens
    // without making their values) does it here, after store(): out = attention of the n new
    // queries (q as attention() takes them) over what the layer holds, and returns true.
    // Default false: the caller attends view(layer, n).
    virtual bool attend(int32_t layer, const kernels::AttentionShape& shape, const float* q, int64_t ldq,
                        int32_t n, float* out, int64_t ldo) {
        (void)layer, (void)shape, (void)q, (void)ldq, (void)n, (void)out, (void)ldo;
        return false;
    }
    // Makes n reserved positions part of the sequence (a compressing cache shrinks here).
    virtual void commit(int32_t n) = 0;
    // Keeps the first n_keep committed positions (n_keep <= n_tokens()) and gives back every
    // slot past them, reserved ones included: truncate(n_tokens()) undoes a reserve.
    virtual void truncate(int32_t n_keep) = 0;
    // Bytes this sequence holds: K and V of every layer, and what a compressing cache keeps
    // to find them (slot ids, positions, statistics).
    virtual size_t bytes() const = 0;

    // Shipping a session to another node (DESIGN.md "One chat turn"): the committed tokens
    // as a small session-wide state (how many, which are kept how) and one part per layer,
    // in the cache's own representation (a compressing cache ships what it holds, not full
    // KV). An empty cache of the same kind and settings takes them back exactly:
    // import_state, then import_layer for every layer in any order; until every layer came
    // in, attention over the missing ones reads zeros (safe, but wrong: admit the session
    // after the last one). Export needs no reserved positions. Errors: kUnimplemented for
    // a cache that cannot be shipped; on import, kFailedPrecondition (the cache is not
    // empty or its settings differ), kDataLoss (a part of the wrong size or contents),
    // kResourceExhausted (no room).
    virtual Result<std::vector<uint8_t>> export_state() const { return not_shippable(); }
    virtual Result<std::vector<uint8_t>> export_layer(int32_t layer) const {
        (void)layer;
        return not_shippable();
    }
    virtual Status import_state(std::span<const uint8_t> state) {
        (void)state;
        return not_shippable();
    }
    virtual Status import_layer(int32_t layer, std::span<const uint8_t> part) {
        (void)layer, (void)part;
        return not_shippable();
    }
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
    virtual int32_t rows_final_end(int32_t layer, bool last = false) const {
        (void)layer;
        (void)last;
        return 0;
    }
    // The state an importer takes before rows of n_tokens positions (sent ahead of them).
    virtual Result<std::vector<uint8_t>> export_rows_state(int32_t n_tokens) const {
        (void)n_tokens;
        return not_shippable();
    }
    virtual Result<std::vector<uint8_t>> export_rows(int32_t layer, int32_t begin, int32_t end) const {
        (void)layer, (void)begin, (void)end;
        return not_shippable();
    }
    virtual Status import_rows(int32_t layer, int32_t begin, int32_t end, std::span<const uint8_t> part) {
        (void)layer, (void)begin, (void)end, (void)part;
        return not_shippable();
    }

protected:
    static Status not_shippable() {
        return unimplemented("this KV policy's cache cannot be shipped between nodes yet");
    }
};

// Bytes of n_tokens tokens in an fp16 cache that keeps everything: the denominator of the
// keep ratio (bytes() / full_fp16_bytes()).
inline size_t full_fp16_bytes(int32_t n_tokens, int32_t n_layers, int32_t kv_dim) {
    return static_cast<size_t>(n_tokens) * static_cast<size_t>(n_layers) * static_cast<size_t>(kv_dim) * 2 * 2;
}

// Every token of every layer in a SlotPool at the pool's precision.
class FullSequenceCache final : public SequenceCache {
public:
    explicit FullSequenceCache(SlotPool& pool) : pool_(pool) {}
    ~FullSequenceCache() override;
    FullSequenceCache(const FullSequenceCache&) = delete;
    FullSequenceCache& operator=(const FullSequenceCache&) = delete;

    int32_t n_tokens() const override { return n_committed_; }
    Status reserve(int32_t n_new) override;
    void store(int32_t layer, int32_t first, int32_t n, const float* k, const float* v,
               int64_t ld) override;
    kernels::KvView view(int32_t layer, int32_t n_visible_new) const override;
    void commit(int32_t n) override;
    void truncate(int32_t n_keep) override;
    size_t bytes() const override;
    // State: the token count and the row size. A layer (or a range of its rows): the K rows,
    // then the V rows, at the pool's precision.
    Result<std::vector<uint8_t>> export_state() const override;
    Result<std::vector<uint8_t>> export_layer(int32_t layer) const override;
    Status import_state(std::span<const uint8_t> state) override;
    Status import_layer(int32_t layer, std::span<const uint8_t> part) override;
    bool ships_rows() const override { return true; }
    int32_t rows_final_end(int32_t /*layer*/, bool /*last*/) const override {
        return static_cast<int32_t>(slots_.size());
    }
    Result<std::vector<uint8_t>> export_rows_state(int32_t n_tokens) const override;
    Result<std::vector<uint8_t>> export_rows(int32_t layer, int32_t begin, int32_t end) const override;
    Status import_rows(int32_t layer, int32_t begin, int32_t end, std::span<const uint8_t> part) override;

private:
    SlotPool& pool_;
    std::vector<int32_t> slots_;  // position -> slot, committed then reserved
    int32_t n_committed_ = 0;
};

}  // namespace deltaserve::kvstore
