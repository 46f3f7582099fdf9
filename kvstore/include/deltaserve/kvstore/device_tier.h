// The device tier of the tiered KV store (issue 36, DESIGN.md "KV representation"): stored KV
// blocks (kv_block.h bytes) in an accelerator's memory, above the host tier. The CUDA backend
// (issue 38) fills it; a build or a machine without one has no device tier, and the host tier
// is the top (SessionTiers takes none). It keeps the host tier's contract: a byte budget,
// least recently used first out, blocks checked by whoever takes them back; blocks travel to
// and from it through host memory (pinned, for UCX), as kv_block.h bytes. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "deltaserve/common/status.h"

namespace deltaserve::kvstore {

class DeviceTier {
  public:
    struct Stats {
        uint64_t capacity = 0, bytes = 0, blocks = 0;
        uint64_t stores = 0, refused = 0, evictions = 0, hits = 0, misses = 0;
    };

    virtual ~DeviceTier() = default;
    // Which device, e.g. "cuda:0".
    virtual std::string device() const = 0;
    // Copies a block in under `key` (replacing what it held), evicting the least recently
    // used until it fits. Errors: kResourceExhausted when it cannot (nothing changes).
    virtual Status put(uint64_t key, std::span<const uint8_t> bytes) = 0;
    // The block copied back into host memory, or kNotFound (a miss).
    virtual Result<std::vector<uint8_t>> get(uint64_t key) = 0;
    virtual bool contains(uint64_t key) const = 0;
    virtual void erase(uint64_t key) = 0;
    virtual Stats stats() const = 0;
};

}  // namespace deltaserve::kvstore
