#include "deltaserve/kvstore/head_slot_pool.h"

#include <new>
#include <string>

namespace deltaserve::kvstore {

Result<std::unique_ptr<HeadSlotPool>> HeadSlotPool::create(const HeadSlotPoolOptions& options) {
    if (options.n_layers <= 0 || options.n_kv_heads <= 0 || options.head_dim <= 0 ||
        options.n_slots <= 0) {
        return invalid_argument(
            "head slot pool: layers, heads, head_dim and slots must be positive");
    }
    if (options.dtype != kernels::DType::kF16 && options.dtype != kernels::DType::kF32) {
        return invalid_argument("head slot pool: KV type must be f16 or f32");
    }
    std::unique_ptr<HeadSlotPool> pool(new HeadSlotPool(options));
    pool->arena_.reset(new (std::nothrow) uint8_t[pool->bytes_]);
    if (!pool->arena_) {
        return resource_exhausted("head slot pool: cannot allocate " +
                                  std::to_string(pool->bytes_) + " bytes of KV cache");
    }
    return pool;
}

HeadSlotPool::HeadSlotPool(const HeadSlotPoolOptions& options) : options_(options) {
    head_bytes_ = kernels::row_bytes(options.dtype, options.head_dim);
    unit_bytes_ = head_bytes_ * static_cast<size_t>(options.n_slots);
    bytes_ = unit_bytes_ * 2 * static_cast<size_t>(n_units());
    free_.resize(static_cast<size_t>(n_units()));
    in_use_.resize(static_cast<size_t>(n_units()));
    for (int32_t u = 0; u < n_units(); ++u) {
        auto& f = free_[u];
        f.resize(static_cast<size_t>(options.n_slots));
        for (int32_t i = 0; i < options.n_slots; ++i) f[i] = options.n_slots - 1 - i;
        in_use_[u].assign(static_cast<size_t>(options.n_slots), 0);
    }
}

Result<std::vector<int32_t>> HeadSlotPool::allocate(int32_t unit, int32_t n) {
    DS_CHECK(unit >= 0 && unit < n_units(), "head slot pool: bad unit");
    auto& f = free_[unit];
    if (n < 0 || n > static_cast<int32_t>(f.size())) {
        return resource_exhausted("KV cache full: " + std::to_string(n) + " slots requested, " +
                                  std::to_string(f.size()) + " free of " +
                                  std::to_string(options_.n_slots) + " in a (layer, head)");
    }
    std::vector<int32_t> out(f.end() - n, f.end());
    f.resize(f.size() - static_cast<size_t>(n));
    for (int32_t s : out) in_use_[unit][s] = 1;
    return out;
}

void HeadSlotPool::release(int32_t unit, std::span<const int32_t> slots) {
    DS_CHECK(unit >= 0 && unit < n_units(), "head slot pool: bad unit");
    for (int32_t s : slots) {
        DS_CHECK(s >= 0 && s < options_.n_slots && in_use_[unit][s],
                 "head slot pool: freeing a free slot");
        in_use_[unit][s] = 0;
        free_[unit].push_back(s);
    }
}

}  // namespace deltaserve::kvstore
