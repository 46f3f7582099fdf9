#include "deltaserve/kvstore/slot_pool.h"

#include <algorithm>
#include <new>
#include <string>

namespace deltaserve::kvstore {

Result<std::unique_ptr<SlotPool>> SlotPool::create(const SlotPoolOptions& options) {
    if (options.n_layers <= 0 || options.kv_dim <= 0 || options.n_slots <= 0 || options.n_kv_heads <= 0 ||
        options.kv_dim % options.n_kv_heads != 0) {
        return invalid_argument("slot pool: layers, kv_dim, heads and slots must be positive, kv_dim a multiple of heads");
    }
    if (options.dtype != kernels::DType::kF16 && options.dtype != kernels::DType::kF32) {
        return invalid_argument("slot pool: KV type must be f16 or f32");
    }
    std::unique_ptr<SlotPool> pool(new SlotPool(options));
    pool->arena_.reset(new (std::nothrow) uint8_t[pool->bytes_]);
    if (!pool->arena_) {
        return resource_exhausted("slot pool: cannot allocate " + std::to_string(pool->bytes_) +
                                  " bytes of KV cache");
    }
    return pool;
}

SlotPool::SlotPool(const SlotPoolOptions& options) : options_(options) {
    row_bytes_ = kernels::row_bytes(options.dtype, options.kv_dim);
    layer_bytes_ = row_bytes_ * static_cast<size_t>(options.n_slots);
    bytes_ = layer_bytes_ * 2 * static_cast<size_t>(options.n_layers);
    free_.resize(static_cast<size_t>(options.n_slots));
    for (int32_t i = 0; i < options.n_slots; ++i) free_[i] = options.n_slots - 1 - i;
    in_use_.assign(static_cast<size_t>(options.n_slots), 0);
}

Result<std::vector<int32_t>> SlotPool::allocate(int32_t n) {
    if (n < 0 || n > free_slots()) {
        return resource_exhausted("KV cache full: " + std::to_string(n) + " slots requested, " +
                                  std::to_string(free_slots()) + " free of " +
                                  std::to_string(capacity()));
    }
    std::vector<int32_t> out(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) {
        out[i] = free_.back();
        free_.pop_back();
        in_use_[out[i]] = 1;
    }
    return out;
}

void SlotPool::release(std::span<const int32_t> slots) {
    for (int32_t s : slots) {
        DS_CHECK(s >= 0 && s < capacity() && in_use_[s], "releasing a slot not in use");
        in_use_[s] = 0;
        free_.push_back(s);
    }
    // Keep the lowest slot at the back so later allocations stay contiguous.
    std::sort(free_.begin(), free_.end(), std::greater<>());
}

}  // namespace deltaserve::kvstore
