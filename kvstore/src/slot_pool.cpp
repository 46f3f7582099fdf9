#include "deltaserve/kvstore/slot_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <string>

namespace deltaserve::kvstore {

namespace {
// The device's default stream for the calling thread: the forward pass's, which runs there.
constexpr kernels::Exec kOnDevice{};
// A device arena's least size, in slots: growing one row at a time would move rows often.
constexpr int32_t kMinDeviceSlots = 256;
}  // namespace

Result<std::unique_ptr<SlotPool>> SlotPool::create(const SlotPoolOptions& options) {
    if (options.n_layers <= 0 || options.kv_dim <= 0 || options.n_slots <= 0 ||
        options.n_kv_heads <= 0 || options.kv_dim % options.n_kv_heads != 0) {
        return invalid_argument(
            "slot pool: layers, kv_dim, heads and slots must be positive, kv_dim a multiple of "
            "heads");
    }
    if (options.dtype != kernels::DType::kF16 && options.dtype != kernels::DType::kF32) {
        return invalid_argument("slot pool: KV type must be f16 or f32");
    }
    std::unique_ptr<SlotPool> pool(new SlotPool(options));
    if (options.backend != nullptr && !options.backend->host_memory()) {
        pool->device_ = options.backend;  // the arena comes with the first slots
        return pool;
    }
    void* arena = mmap(nullptr, pool->bytes_, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (arena == MAP_FAILED) {
        return resource_exhausted("slot pool: cannot map " + std::to_string(pool->bytes_) +
                                  " bytes of KV cache");
    }
    pool->arena_ = static_cast<uint8_t*>(arena);
    pool->arena_slots_ = options.n_slots;
    return pool;
}

SlotPool::~SlotPool() {
    if (arena_ != nullptr && device_ == nullptr) munmap(arena_, bytes_);
}

int32_t SlotPool::top() const {
    int32_t top = options_.n_slots;
    while (top > 0 && !in_use_[top - 1]) --top;
    return top;
}

Status SlotPool::resize_device_arena(int32_t slots, int32_t keep) {
    const size_t layer = row_bytes_ * static_cast<size_t>(slots);
    DS_ASSIGN_OR_RETURN(kernels::Buffer next,
                        device_->alloc(layer * 2 * static_cast<size_t>(options_.n_layers)));
    auto* to = static_cast<uint8_t*>(next.data());
    const size_t moved = row_bytes_ * static_cast<size_t>(keep);
    for (int32_t l = 0; moved > 0 && l < options_.n_layers; ++l) {
        for (int kv = 0; kv < 2; ++kv) {
            DS_RETURN_IF_ERROR(device_->copy(to + (static_cast<size_t>(l) * 2 + kv) * layer,
                                             base(l, kv), moved, kOnDevice));
        }
    }
    device_arena_ = std::move(next);  // the old arena goes after the copies (Buffer's end)
    arena_ = to;
    arena_slots_ = slots;
    return Status();
}

void SlotPool::trim() {
    const int32_t top = this->top();
    if (device_ != nullptr) {
        const int32_t want = std::max(top, kMinDeviceSlots);
        // Shrinks only when the rows in use fill half or less, so that growing back is far.
        if (arena_slots_ > 0 && top == 0) {
            device_arena_ = kernels::Buffer();
            arena_ = nullptr;
            arena_slots_ = 0;
        } else if (2 * want <= arena_slots_) {
            (void)resize_device_arena(want, top);  // kept as it is on failure
        }
        return;
    }
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t layer_bytes = row_bytes_ * static_cast<size_t>(options_.n_slots);
    for (int32_t layer = 0; layer < options_.n_layers; ++layer) {
        for (int kv = 0; kv < 2; ++kv) {
            const auto begin = reinterpret_cast<uintptr_t>(base(layer, kv) + top * row_bytes_);
            const auto end = reinterpret_cast<uintptr_t>(base(layer, kv) + layer_bytes);
            const uintptr_t b = (begin + page - 1) / page * page, e = end / page * page;
            if (e > b) madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);
        }
    }
}

size_t SlotPool::resident_bytes() const {
    if (device_ != nullptr) return device_arena_.bytes();
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    std::vector<unsigned char> in((bytes_ + page - 1) / page);
    if (mincore(arena_, bytes_, in.data()) != 0) return bytes_;
    size_t pages = 0;
    for (unsigned char c : in) pages += c & 1;
    return pages * page;
}

SlotPool::SlotPool(const SlotPoolOptions& options) : options_(options) {
    row_bytes_ = kernels::row_bytes(options.dtype, options.kv_dim);
    bytes_ = row_bytes_ * static_cast<size_t>(options.n_slots) * 2 *
             static_cast<size_t>(options.n_layers);
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
    // The lowest free slots are at the back; the n-th from it is the highest taken.
    const int32_t need = n > 0 ? free_[free_.size() - static_cast<size_t>(n)] + 1 : 0;
    if (device_ != nullptr && need > arena_slots_) {
        const int32_t slots =
            std::min(options_.n_slots, std::max({need, 2 * arena_slots_, kMinDeviceSlots}));
        if (Status st = resize_device_arena(slots, top()); !st.ok()) {
            return st.with_context("slot pool: " + std::to_string(slots) + " slots on " +
                                   device_->description());
        }
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
