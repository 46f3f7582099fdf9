// A token-granular pool of KV slots: for every layer, one K row and one V row per slot,
// each holding all KV heads of one token (DESIGN.md "KV representation").
//
// Slots are handed out and returned individually, so sequences of any length share one
// arena without fragmentation. Not thread-safe: one owner allocates and frees.
//
// In host memory the arena is address space for every slot, paged in as rows are written
// and given back by trim(). In a device backend's memory (no paging there) it holds the
// slots up to the highest in use: allocate() grows it (at least doubling, so each row moves
// O(1) times) and trim() shrinks it once the rows in use fill at most half, the rows moving
// with it; row pointers and k_base() change then.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "deltaserve/common/status.h"
#include "deltaserve/kernels/backend.h"
#include "deltaserve/kernels/dtype.h"

namespace deltaserve::kvstore {

struct LayerRows;  // src/layer_rows.h

struct SlotPoolOptions {
    int32_t n_layers = 0;
    int32_t kv_dim = 0;   // n_kv_heads * head_dim
    int32_t n_slots = 0;  // capacity in tokens
    // Element type of K and V: kF16 (default) or kF32.
    kernels::DType dtype = kernels::DType::kF16;
    int32_t n_kv_heads = 1;  // heads in a row (kv_dim / n_kv_heads elements each)
    // Where the rows live: nullptr (or a backend whose memory is the host's) for host memory;
    // a device backend's memory otherwise.
    kernels::Backend* backend = nullptr;
};

class SlotPool {
  public:
    // Errors: kInvalidArgument for bad sizes, kResourceExhausted when the arena cannot be
    // allocated.
    static Result<std::unique_ptr<SlotPool>> create(const SlotPoolOptions& options);

    // Takes n free slots (lowest first, so a lone sequence gets contiguous slots).
    // Errors: kResourceExhausted when fewer than n are free, or (on a device) the arena cannot
    // grow; the backend's errors moving the rows. Nothing is taken then.
    Result<std::vector<int32_t>> allocate(int32_t n);
    // Returns slots to the pool. Freeing a slot that is not in use is a bug (aborts).
    void release(std::span<const int32_t> slots);

    int32_t capacity() const { return options_.n_slots; }
    int32_t free_slots() const { return static_cast<int32_t>(free_.size()); }
    const SlotPoolOptions& options() const { return options_; }

    // The device backend whose memory holds the rows, or nullptr for host memory. Host code
    // reads and writes device rows only through the row ops below.
    kernels::Backend* device() const { return device_; }

    // Row ops that work on either memory (on a device, through the backend on its default
    // stream; slot lists in host memory). store: n fp32 rows of K and of V (ld floats apart;
    // in the rows' memory) into `slots` of a layer at the pool's precision. read_rows /
    // write_rows: the K rows then the V rows of `slots` of a layer as bytes in host memory
    // (2 * slots.size() * row_bytes()); write_rows with `bytes` null writes zeros. move_rows:
    // every layer's K and V rows of from[i] to to[i] (no slot in both lists). Errors: the
    // backend's (host memory has none).
    Status store(int32_t layer, std::span<const int32_t> slots, const float* k, const float* v,
                 int64_t ld);
    Status read_rows(int32_t layer, std::span<const int32_t> slots, uint8_t* bytes) const;
    Status write_rows(int32_t layer, std::span<const int32_t> slots, const uint8_t* bytes);
    Status move_rows(std::span<const int32_t> from, std::span<const int32_t> to);

    size_t row_bytes() const { return row_bytes_; }
    size_t head_bytes() const { return row_bytes_ / static_cast<size_t>(options_.n_kv_heads); }
    uint8_t* k_row(int32_t layer, int32_t slot) { return base(layer, 0) + slot * row_bytes_; }
    uint8_t* v_row(int32_t layer, int32_t slot) { return base(layer, 1) + slot * row_bytes_; }
    const uint8_t* k_base(int32_t layer) const { return base(layer, 0); }
    const uint8_t* v_base(int32_t layer) const { return base(layer, 1); }
    // Bytes of an arena for every slot: in host memory its address space, paged in as rows
    // are first written; the most a device's arena grows to.
    size_t bytes() const { return bytes_; }
    // Gives the memory of the slots past the highest one in use back: in host memory in whole
    // pages of each layer's K and V (their rows read as zeros until written again); on a
    // device by moving the rows to a smaller arena when they fill at most half (nothing
    // changes when that fails). An owner that frees slots in the middle moves its rows down
    // first (DeltaKvSequenceCache::compact).
    void trim();
    // Bytes of the arena in memory now: in host memory those paged in (mincore), not what
    // trim() gave back; on a device the arena's.
    size_t resident_bytes() const;

    ~SlotPool();
    SlotPool(const SlotPool&) = delete;
    SlotPool& operator=(const SlotPool&) = delete;

  private:
    explicit SlotPool(const SlotPoolOptions& options);
    // A layer's K and V arrays, for the row ops (src/layer_rows.h).
    LayerRows rows_of(int32_t layer) const;
    uint8_t* base(int32_t layer, int kv) const {
        return arena_ + (static_cast<size_t>(layer) * 2 + kv) * row_bytes_ * arena_slots_;
    }
    // One past the highest slot in use.
    int32_t top() const;
    // A device arena of `slots` slots per layer K and V, holding the rows of [0, keep).
    Status resize_device_arena(int32_t slots, int32_t keep);

    SlotPoolOptions options_;
    size_t row_bytes_ = 0;
    size_t bytes_ = 0;
    // Host: mapped for every slot, pages come and go (trim). Device: device_arena_'s memory,
    // arena_slots_ slots per layer K and V.
    uint8_t* arena_ = nullptr;
    int32_t arena_slots_ = 0;
    kernels::Backend* device_ = nullptr;
    kernels::Buffer device_arena_;
    std::vector<int32_t> free_;  // kept sorted descending: back() is the lowest free slot
    std::vector<uint8_t> in_use_;
};

}  // namespace deltaserve::kvstore
