// A pool of per-(layer, KV head) slots: a slot holds one head's K and V vectors for one
// token, and every (layer, head) unit has its own free list. Policies that keep different
// tokens per head (DESIGN.md "KV representation": KV-Compress, D2O, TRIM-KV, KeyDiff, and
// the H2O / SnapKV baselines) free memory per head with it, where a SlotPool row holds all
// heads of a token and frees only whole tokens. Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "deltaserve/common/status.h"
#include "deltaserve/kernels/dtype.h"

namespace deltaserve::kvstore {

struct HeadSlotPoolOptions {
    int32_t n_layers = 0;
    int32_t n_kv_heads = 0;
    int32_t head_dim = 0;
    int32_t n_slots = 0;  // capacity of every (layer, head) unit, in tokens
    kernels::DType dtype = kernels::DType::kF16;
};

class HeadSlotPool {
  public:
    // Errors: kInvalidArgument for bad sizes, kResourceExhausted when the arena cannot be
    // allocated.
    static Result<std::unique_ptr<HeadSlotPool>> create(const HeadSlotPoolOptions& options);

    int32_t unit(int32_t layer, int32_t head) const { return layer * options_.n_kv_heads + head; }
    int32_t n_units() const { return options_.n_layers * options_.n_kv_heads; }

    // Takes n free slots of a unit. Errors: kResourceExhausted (nothing is taken).
    Result<std::vector<int32_t>> allocate(int32_t unit, int32_t n);
    // Returns slots of a unit. Freeing a slot that is not in use is a bug (aborts).
    void release(int32_t unit, std::span<const int32_t> slots);
    int32_t free_slots(int32_t unit) const { return static_cast<int32_t>(free_[unit].size()); }

    const HeadSlotPoolOptions& options() const { return options_; }
    size_t head_bytes() const { return head_bytes_; }  // one K (or V) vector
    uint8_t* k_row(int32_t unit, int32_t slot) { return base(unit, 0) + slot * head_bytes_; }
    uint8_t* v_row(int32_t unit, int32_t slot) { return base(unit, 1) + slot * head_bytes_; }
    const uint8_t* k_base(int32_t unit) const { return base(unit, 0); }
    const uint8_t* v_base(int32_t unit) const { return base(unit, 1); }
    size_t bytes() const { return bytes_; }

  private:
    explicit HeadSlotPool(const HeadSlotPoolOptions& options);
    uint8_t* base(int32_t unit, int kv) const {
        return arena_.get() + (static_cast<size_t>(unit) * 2 + kv) * unit_bytes_;
    }

    HeadSlotPoolOptions options_;
    size_t head_bytes_ = 0;
    size_t unit_bytes_ = 0;
    size_t bytes_ = 0;
    std::unique_ptr<uint8_t[]> arena_;
    std::vector<std::vector<int32_t>> free_;  // per unit; back() is the next slot handed out
    std::vector<std::vector<uint8_t>> in_use_;
};

}  // namespace deltaserve::kvstore
