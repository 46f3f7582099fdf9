// The device tier in a backend's memory: one Buffer per block, an LRU list, a byte budget.
#include "deltaserve/kvstore/device_tier.h"

#include <list>
#include <mutex>
#include <unordered_map>

#include "deltaserve/kernels/backend.h"

namespace deltaserve::kvstore {

namespace {

// The device's default stream for the calling thread; every copy waits for its end.
constexpr kernels::Exec kOnDevice{};

class BackendDeviceTier final : public DeviceTier {
  public:
    BackendDeviceTier(kernels::Backend& backend, uint64_t capacity)
        : backend_(backend), capacity_(capacity) {}

    std::string device() const override { return backend_.description(); }

    Status put(uint64_t key, std::span<const uint8_t> bytes) override {
        const uint64_t size = bytes.size();
        if (size > capacity_) {
            std::lock_guard lock(mu_);
            ++stats_.refused;
            return resource_exhausted("device tier: a block of " + std::to_string(size) +
                                      " bytes is larger than its " + std::to_string(capacity_));
        }
        // Copied in before anything is evicted or replaced: a failure changes nothing.
        auto block = std::make_shared<Block>();
        if (size > 0) {
            auto buf = backend_.alloc(size);
            if (!buf.ok()) {
                std::lock_guard lock(mu_);
                ++stats_.refused;
                return buf.status().with_context("device tier");
            }
            block->mem = std::move(*buf);
            DS_RETURN_IF_ERROR(backend_.copy_in(block->mem.data(), bytes.data(), size, kOnDevice)
                                   .with_context("device tier"));
            DS_RETURN_IF_ERROR(backend_.synchronize(kOnDevice).with_context("device tier"));
        }
        block->size = size;
        std::vector<std::shared_ptr<Block>> dropped;  // freed after the lock
        std::lock_guard lock(mu_);
        if (auto it = blocks_.find(key); it != blocks_.end()) {
            dropped.push_back(it->second.block);
            remove_locked(it);
        }
        while (bytes_ + size > capacity_ && !lru_.empty()) {
            auto victim = blocks_.find(lru_.back());
            dropped.push_back(victim->second.block);
            remove_locked(victim);
            ++stats_.evictions;
        }
        lru_.push_front(key);
        blocks_.emplace(key, Entry{std::move(block), lru_.begin()});
        bytes_ += size;
        ++stats_.stores;
        return Status();
    }

    Result<std::vector<uint8_t>> get(uint64_t key) override {
        std::shared_ptr<const Block> block;  // held through the copy: an eviction frees it after
        {
            std::lock_guard lock(mu_);
            auto it = blocks_.find(key);
            if (it == blocks_.end()) {
                ++stats_.misses;
                return missing(key);
            }
            lru_.splice(lru_.begin(), lru_, it->second.lru);
            ++stats_.hits;
            block = it->second.block;
        }
        return copy_back(*block);
    }
    Result<std::vector<uint8_t>> peek(uint64_t key) const override {
        std::shared_ptr<const Block> block;
        {
            std::lock_guard lock(mu_);
            auto it = blocks_.find(key);
            if (it == blocks_.end()) return missing(key);
            block = it->second.block;
        }
        return copy_back(*block);
    }

    bool contains(uint64_t key) const override {
        std::lock_guard lock(mu_);
        return blocks_.count(key) != 0;
    }
    std::optional<uint64_t> size_of(uint64_t key) const override {
        std::lock_guard lock(mu_);
        auto it = blocks_.find(key);
        if (it == blocks_.end()) return std::nullopt;
        return it->second.block->size;
    }
    void erase(uint64_t key) override {
        std::shared_ptr<Block> dropped;
        std::lock_guard lock(mu_);
        if (auto it = blocks_.find(key); it != blocks_.end()) {
            dropped = it->second.block;
            remove_locked(it);
        }
    }
    Stats stats() const override {
        std::lock_guard lock(mu_);
        Stats s = stats_;
        s.capacity = capacity_;
        s.bytes = bytes_;
        s.blocks = blocks_.size();
        return s;
    }

  private:
    struct Block {
        kernels::Buffer mem;
        uint64_t size = 0;
    };
    static Status missing(uint64_t key) {
        return not_found("device tier: no block " + std::to_string(key));
    }
    // A block's bytes in host memory.
    Result<std::vector<uint8_t>> copy_back(const Block& block) const;
    struct Entry {
        std::shared_ptr<Block> block;
        std::list<uint64_t>::iterator lru;
    };
    void remove_locked(std::unordered_map<uint64_t, Entry>::iterator it) {
        bytes_ -= it->second.block->size;
        lru_.erase(it->second.lru);
        blocks_.erase(it);
    }

    kernels::Backend& backend_;
    const uint64_t capacity_;
    mutable std::mutex mu_;
    std::unordered_map<uint64_t, Entry> blocks_;
    std::list<uint64_t> lru_;  // most recently used first
    uint64_t bytes_ = 0;
    Stats stats_;
};

Result<std::vector<uint8_t>> BackendDeviceTier::copy_back(const Block& block) const {
    std::vector<uint8_t> out(block.size);
    if (block.size > 0) {
        DS_RETURN_IF_ERROR(backend_.copy_out(out.data(), block.mem.data(), block.size, kOnDevice)
                               .with_context("device tier"));
    }
    return out;
}

}  // namespace

Result<std::unique_ptr<DeviceTier>> make_device_tier(kernels::Backend& backend,
                                                     uint64_t capacity_bytes) {
    if (backend.host_memory()) {
        return invalid_argument("device tier: the " + std::string(backend.name()) +
                                " backend's memory is the host's (the host tier holds it)");
    }
    if (capacity_bytes == 0) return invalid_argument("device tier: a zero capacity");
    DS_RETURN_IF_ERROR(backend.availability());
    return std::unique_ptr<DeviceTier>(new BackendDeviceTier(backend, capacity_bytes));
}

}  // namespace deltaserve::kvstore
