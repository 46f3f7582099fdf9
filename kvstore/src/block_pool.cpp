#include "deltaserve/kvstore/block_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <functional>
#include <string>

#include "deltaserve/kernels/dtype.h"

namespace deltaserve::kvstore {

size_t BlockPool::block_bytes(const BlockPoolOptions& o) {
    return kernels::row_bytes(o.dtype, o.kv_dim) * 2 * static_cast<size_t>(o.n_layers) *
           kBlockTokens;
}

int32_t BlockPool::blocks_in(const BlockPoolOptions& o, size_t bytes) {
    const size_t b = block_bytes(o);
    if (b == 0) return 1;
    return static_cast<int32_t>(std::clamp<size_t>(bytes / b, 1, size_t{1} << 26));
}

Result<std::shared_ptr<BlockPool>> BlockPool::create(const BlockPoolOptions& options) {
    if (options.n_layers <= 0 || options.kv_dim <= 0 || options.n_blocks <= 0 ||
        options.n_kv_heads <= 0 || options.kv_dim % options.n_kv_heads != 0 ||
        options.n_blocks > (1 << 26)) {
        return invalid_argument(
            "block pool: layers, kv_dim, heads and blocks (at most 2^26) must be positive, "
            "kv_dim a multiple of heads");
    }
    if (options.dtype != kernels::DType::kF16 && options.dtype != kernels::DType::kF32) {
        return invalid_argument("block pool: KV type must be f16 or f32");
    }
    std::shared_ptr<BlockPool> pool(new BlockPool(options));
    if (options.backend != nullptr && !options.backend->host_memory()) {
        auto arena = options.backend->alloc(pool->bytes_);
        if (!arena.ok()) {
            return arena.status().with_context("block pool: " + std::to_string(pool->bytes_) +
                                               " bytes of KV memory on " +
                                               options.backend->description());
        }
        pool->device_ = options.backend;
        pool->device_arena_ = std::move(*arena);
        pool->arena_ = static_cast<uint8_t*>(pool->device_arena_.data());
        return pool;
    }
    // Mapped without reserving swap: a node's budget is address space until it is used.
    void* arena = mmap(nullptr, pool->bytes_, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (arena == MAP_FAILED) {
        return resource_exhausted("block pool: cannot map " + std::to_string(pool->bytes_) +
                                  " bytes of KV memory");
    }
    pool->arena_ = static_cast<uint8_t*>(arena);
    return pool;
}

BlockPool::BlockPool(const BlockPoolOptions& options) : options_(options) {
    row_bytes_ = kernels::row_bytes(options.dtype, options.kv_dim);
    layer_bytes_ = row_bytes_ * static_cast<size_t>(options.n_blocks) * kBlockTokens;
    bytes_ = layer_bytes_ * 2 * static_cast<size_t>(options.n_layers);
    free_.resize(static_cast<size_t>(options.n_blocks));
    for (int32_t i = 0; i < options.n_blocks; ++i) free_[i] = i;  // sorted: a valid min-heap
    refs_.assign(static_cast<size_t>(options.n_blocks), 0);
}

BlockPool::~BlockPool() {
    if (arena_ != nullptr && device_ == nullptr) munmap(arena_, bytes_);
}

bool BlockPool::take_locked(int32_t n, std::vector<int32_t>& out) {
    if (n > static_cast<int32_t>(free_.size())) return false;
    out.resize(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) {
        std::pop_heap(free_.begin(), free_.end(), std::greater<>());
        out[i] = free_.back();
        free_.pop_back();
        refs_[out[i]] = 1;
    }
    peak_ = std::max(peak_, options_.n_blocks - static_cast<int32_t>(free_.size()));
    return true;
}

Result<std::vector<int32_t>> BlockPool::allocate(int32_t n) {
    if (n < 0) return invalid_argument("block pool: a negative block count");
    std::vector<int32_t> out;
    int32_t missing = 0;
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (take_locked(n, out)) return out;
        missing = n - static_cast<int32_t>(free_.size());
    }
    if (reclaimer_) reclaimer_(missing);
    std::lock_guard<std::mutex> lock(mu_);
    if (take_locked(n, out)) return out;
    return resource_exhausted("KV memory full: " + std::to_string(n) + " blocks requested, " +
                              std::to_string(free_.size()) + " free of " +
                              std::to_string(capacity()));
}

void BlockPool::retain(std::span<const int32_t> blocks) {
    std::lock_guard<std::mutex> lock(mu_);
    for (int32_t b : blocks) {
        DS_CHECK(b >= 0 && b < capacity() && refs_[b] > 0, "retaining a free block");
        ++refs_[b];
    }
}

void BlockPool::release(std::span<const int32_t> blocks) {
    std::lock_guard<std::mutex> lock(mu_);
    for (int32_t b : blocks) {
        DS_CHECK(b >= 0 && b < capacity() && refs_[b] > 0, "releasing a free block");
        if (--refs_[b] > 0) continue;
        free_.push_back(b);
        std::push_heap(free_.begin(), free_.end(), std::greater<>());
    }
}

int32_t BlockPool::refs(int32_t block) const {
    std::lock_guard<std::mutex> lock(mu_);
    return block >= 0 && block < capacity() ? refs_[block] : 0;
}

int32_t BlockPool::free_blocks() const {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int32_t>(free_.size());
}

int32_t BlockPool::peak_blocks() const {
    std::lock_guard<std::mutex> lock(mu_);
    return peak_;
}

}  // namespace deltaserve::kvstore
