// Paged KV memory (vLLM's block manager, DESIGN.md "KV representation"): every layer's K and V
// rows of kBlockTokens consecutive tokens make a block; sequences hold whole blocks through
// block tables and share them by reference count (automatic prefix caching: a block of a
// prompt's prefix serves every sequence that starts the same way). One pool serves a node:
// its capacity is a byte budget, whatever mix of sessions spends it.
//
// A block's rows are written only by the sequence that allocated it, before anyone else holds
// it; a shared block is read-only (a sequence that must write into one copies it first).
// allocate, retain, release and the counts are thread-safe; rows are reached without a lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "deltaserve/common/status.h"
#include "deltaserve/kernels/backend.h"
#include "deltaserve/kernels/dtype.h"

namespace deltaserve::kvstore {

struct LayerRows;  // src/layer_rows.h

struct BlockPoolOptions {
    int32_t n_layers = 0;
    int32_t kv_dim = 0;  // n_kv_heads * head_dim
    int32_t n_kv_heads = 1;
    // Element type of K and V: kF16 (default) or kF32.
    kernels::DType dtype = kernels::DType::kF16;
    int32_t n_blocks = 0;  // capacity
    // Where the rows live: nullptr (or the CPU backend) for host memory; a device backend's
    // memory otherwise (Backend::host_memory() false), allocated whole when the pool is made.
    kernels::Backend* backend = nullptr;
};

class BlockPool {
  public:
    static constexpr int32_t kBlockTokens = 16;

    // Errors: kInvalidArgument for bad sizes, kResourceExhausted when the arena cannot be
    // reserved. In host memory the arena is address space until a block is first written: the
    // pages a node touches are those of the most blocks it held at once (the lowest free block
    // goes first). On a device the arena is allocated at once; the backend's errors.
    static Result<std::shared_ptr<BlockPool>> create(const BlockPoolOptions& options);
    // Bytes of one block: K and V of every layer for kBlockTokens tokens.
    static size_t block_bytes(const BlockPoolOptions& options);
    // Blocks in a budget of `bytes` (at least 1).
    static int32_t blocks_in(const BlockPoolOptions& options, size_t bytes);

    BlockPool(const BlockPool&) = delete;
    BlockPool& operator=(const BlockPool&) = delete;

    // Takes n free blocks, each with one reference, lowest first. When fewer are free, the
    // reclaimer (if any) is asked once for what is missing, without the pool's lock held.
    // Errors: kResourceExhausted when fewer than n are free even then (nothing is taken).
    Result<std::vector<int32_t>> allocate(int32_t n);
    // One more reference to each block (in use).
    void retain(std::span<const int32_t> blocks);
    // One reference less to each; a block with none is free. Releasing a free block is a bug
    // (aborts).
    void release(std::span<const int32_t> blocks);
    int32_t refs(int32_t block) const;

    // Called when an allocation finds fewer free blocks than it needs, with how many are
    // missing: gives back what it can (a prefix cache drops blocks only it holds). Set before
    // the pool is shared; it runs on the allocating thread, which holds no pool lock.
    void set_reclaimer(std::function<void(int32_t missing)> reclaimer) {
        reclaimer_ = std::move(reclaimer);
    }

    int32_t capacity() const { return options_.n_blocks; }
    int32_t free_blocks() const;
    // The most blocks in use at once so far.
    int32_t peak_blocks() const;
    const BlockPoolOptions& options() const { return options_; }

    // The device backend whose memory holds the rows, or nullptr for host memory. Host code
    // reads and writes device rows only through the row ops below.
    kernels::Backend* device() const { return device_; }

    // Row ops that work on either memory (on a device, through the backend on its default
    // stream, and the slot lists host memory). store: n fp32 rows of K and of V (ld floats
    // apart; in the rows' memory) into `slots` of a layer at the pool's precision.
    // read_rows / write_rows: the K rows then the V rows of `slots` of a layer, as bytes in
    // host memory (2 * slots.size() * row_bytes()); write_rows with `bytes` null writes
    // zeros. copy_rows: n consecutive slots of every layer, K and V, from src_slot on to
    // dst_slot on. Errors: the backend's (host memory has none).
    Status store(int32_t layer, std::span<const int32_t> slots, const float* k, const float* v,
                 int64_t ld);
    Status read_rows(int32_t layer, std::span<const int32_t> slots, uint8_t* bytes) const;
    Status write_rows(int32_t layer, std::span<const int32_t> slots, const uint8_t* bytes);
    Status copy_rows(int32_t dst_slot, int32_t src_slot, int32_t n);

    size_t row_bytes() const { return row_bytes_; }
    size_t head_bytes() const { return row_bytes_ / static_cast<size_t>(options_.n_kv_heads); }
    size_t block_bytes() const { return block_bytes(options_); }
    // A token's slot: slot(block, i) = block * kBlockTokens + i; K and V rows are slot-indexed
    // per layer, as kernels::KvView reads them.
    static int32_t slot(int32_t block, int32_t i) { return block * kBlockTokens + i; }
    uint8_t* k_row(int32_t layer, int32_t slot) { return base(layer, 0) + slot * row_bytes_; }
    uint8_t* v_row(int32_t layer, int32_t slot) { return base(layer, 1) + slot * row_bytes_; }
    const uint8_t* k_base(int32_t layer) const { return base(layer, 0); }
    const uint8_t* v_base(int32_t layer) const { return base(layer, 1); }
    // Bytes of the arena (capacity * block_bytes()).
    size_t bytes() const { return bytes_; }

    ~BlockPool();

  private:
    explicit BlockPool(const BlockPoolOptions& options);
    // A layer's K and V arrays, for the row ops (src/layer_rows.h).
    LayerRows rows_of(int32_t layer) const;
    uint8_t* base(int32_t layer, int kv) const {
        return arena_ + (static_cast<size_t>(layer) * 2 + kv) * layer_bytes_;
    }
    // Under mu_: takes n free blocks if there are that many.
    bool take_locked(int32_t n, std::vector<int32_t>& out);

    const BlockPoolOptions options_;
    size_t row_bytes_ = 0;
    size_t layer_bytes_ = 0;
    size_t bytes_ = 0;
    uint8_t* arena_ = nullptr;  // host: mapped, not committed (pages come as blocks are written)
    kernels::Backend* device_ = nullptr;
    kernels::Buffer device_arena_;  // on a device: arena_ is its memory
    std::function<void(int32_t)> reclaimer_;
    mutable std::mutex mu_;
    std::vector<int32_t> free_;  // a min-heap: the lowest free block on top
    std::vector<int32_t> refs_;  // per block; 0 = free
    int32_t peak_ = 0;
};

}  // namespace deltaserve::kvstore
