// The device tier of the tiered KV store (issue 36, DESIGN.md "KV representation"): stored KV
// blocks (kv_block.h bytes) in an accelerator's memory, above the host tier. make_device_tier
// puts it in a device backend's memory (kernels::Backend, the CUDA one on a GPU); a build or a
// machine without one has no device tier, and the host tier is the top (SessionTiers takes
// none). It keeps the host tier's contract: a byte budget, least recently used first out,
// blocks checked by whoever takes them back; blocks travel to and from it through host
// memory, as kv_block.h bytes. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "deltaserve/common/status.h"

namespace deltaserve::kernels {
class Backend;
}

namespace deltaserve::kvstore {

class DeviceTier {
  public:
    struct Stats {
        uint64_t capacity = 0, bytes = 0, blocks = 0;
        uint64_t stores = 0, refused = 0, evictions = 0, hits = 0, misses = 0;
    };

    virtual ~DeviceTier() = default;
    // Which device, e.g. "cuda: NVIDIA H200 (sm_90, 139 GiB)".
    virtual std::string device() const = 0;
    // Copies a block in under `key` (replacing what it held), evicting the least recently
    // used until it fits. Errors: kResourceExhausted when it cannot (larger than the
    // capacity, or the device has no memory for it), the device's; nothing changes then.
    virtual Status put(uint64_t key, std::span<const uint8_t> bytes) = 0;
    // The block copied back into host memory (a hit, and now the most recently used), or
    // kNotFound (a miss); the device's errors.
    virtual Result<std::vector<uint8_t>> get(uint64_t key) = 0;
    // The same for a look (the tools): no hit counted, its place in the LRU unchanged.
    virtual Result<std::vector<uint8_t>> peek(uint64_t key) const = 0;
    virtual bool contains(uint64_t key) const = 0;
    virtual std::optional<uint64_t> size_of(uint64_t key) const = 0;  // nullopt: not held
    virtual void erase(uint64_t key) = 0;
    virtual Stats stats() const = 0;
};

// A device tier of `capacity_bytes` in `backend`'s memory, each block its own allocation
// (Backend::alloc), made when it is put. Errors: kInvalidArgument for a backend whose
// memory is the host's (the host tier is that) or a zero capacity.
Result<std::unique_ptr<DeviceTier>> make_device_tier(kernels::Backend& backend,
                                                     uint64_t capacity_bytes);

}  // namespace deltaserve::kvstore
