// A token-granular pool of KV slots: for every layer, one K row and one V row per slot,
// each holding all KV heads of one token (DESIGN.md "KV representation").
//
// Slots are handed out and returned individually, so sequences of any length share one
// arena without fragmentation. Not thread-safe: one owner allocates and frees.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "deltaserve/common/status.h"
#include "deltaserve/kernels/dtype.h"

namespace deltaserve::kvstore {

struct SlotPoolOptions {
    int32_t n_layers = 0;
    int32_t kv_dim = 0;   // n_kv_heads * head_dim
    int32_t n_slots = 0;  // capacity in tokens
    // Element type of K and V: kF16 (default) or kF32.
    kernels::DType dtype = kernels::DType::kF16;
    int32_t n_kv_heads = 1;  // heads in a row (kv_dim / n_kv_heads elements each)
};

class SlotPool {
  public:
    // Errors: kInvalidArgument for bad sizes, kResourceExhausted when the arena cannot be
    // allocated.
    static Result<std::unique_ptr<SlotPool>> create(const SlotPoolOptions& options);

    // Takes n free slots (lowest first, so a lone sequence gets contiguous slots).
    // Errors: kResourceExhausted when fewer than n are free (nothing is taken).
    Result<std::vector<int32_t>> allocate(int32_t n);
    // Returns slots to the pool. Freeing a slot that is not in use is a bug (aborts).
    void release(std::span<const int32_t> slots);

    int32_t capacity() const { return options_.n_slots; }
    int32_t free_slots() const { return static_cast<int32_t>(free_.size()); }
    const SlotPoolOptions& options() const { return options_; }

    size_t row_bytes() const { return row_bytes_; }
    size_t head_bytes() const { return row_bytes_ / static_cast<size_t>(options_.n_kv_heads); }
    uint8_t* k_row(int32_t layer, int32_t slot) { return base(layer, 0) + slot * row_bytes_; }
    uint8_t* v_row(int32_t layer, int32_t slot) { return base(layer, 1) + slot * row_bytes_; }
    const uint8_t* k_base(int32_t layer) const { return base(layer, 0); }
    const uint8_t* v_base(int32_t layer) const { return base(layer, 1); }
    // Bytes of the arena: address space, paged in as rows are first written.
    size_t bytes() const { return bytes_; }
    // Gives the memory of the slots past the highest one in use back to the system, in whole
    // pages of each layer's K and V (their rows read as zeros until written again). An owner
    // that frees slots in the middle moves its rows down first (DeltaKvSequenceCache::compact).
    void trim();
    // Bytes of the arena in memory now (mincore): what trim() gave back is not counted.
    size_t resident_bytes() const;

    ~SlotPool();
    SlotPool(const SlotPool&) = delete;
    SlotPool& operator=(const SlotPool&) = delete;

  private:
    explicit SlotPool(const SlotPoolOptions& options);
    uint8_t* base(int32_t layer, int kv) const {
        return arena_ + (static_cast<size_t>(layer) * 2 + kv) * layer_bytes_;
    }

    SlotPoolOptions options_;
    size_t row_bytes_ = 0;
    size_t layer_bytes_ = 0;
    size_t bytes_ = 0;
    uint8_t* arena_ = nullptr;   // mapped: pages come and go (trim)
    std::vector<int32_t> free_;  // kept sorted descending: back() is the lowest free slot
    std::vector<uint8_t> in_use_;
};

}  // namespace deltaserve::kvstore
