// The host tier of the tiered KV store (issue 36, DESIGN.md "KV representation"): stored KV
// blocks (kv_block.h bytes) in host memory under a byte budget, keyed by their chained keys.
// A block a turn or a transfer is reading is held by a lease, with an owner and a deadline:
// it is not evicted while any lease on it lasts, and the janitor (a thread, or reap_expired
// called by hand) ends leases past their deadline, so a client that died never holds memory
// for long. A pinned block (an operator's pin) is never evicted. Otherwise the least recently
// used block goes first when room is needed. The bytes are shared: a reader that still holds
// a lease's view after the block was evicted or replaced reads what it was given, never freed
// memory. Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "deltaserve/common/status.h"

namespace deltaserve::kvstore {

class HostTier {
  public:
    using Clock = std::chrono::steady_clock;
    using Bytes = std::shared_ptr<const std::vector<uint8_t>>;

    struct Options {
        uint64_t capacity_bytes = 0;
        // How often the janitor thread reaps expired leases; zero: no thread (the owner calls
        // reap_expired).
        std::chrono::milliseconds janitor_interval{1000};
    };

    struct Stats {
        uint64_t capacity = 0, bytes = 0, blocks = 0, pinned = 0, leases = 0;
        uint64_t stores = 0, refused = 0, evictions = 0, hits = 0, misses = 0;
        uint64_t leases_expired = 0;
    };

    // What a lease is, for tools (deltactl lists them).
    struct LeaseInfo {
        uint64_t key = 0;
        std::string owner;
        Clock::time_point deadline;
    };

    class Lease;

    explicit HostTier(const Options& options);
    ~HostTier();
    HostTier(const HostTier&) = delete;
    HostTier& operator=(const HostTier&) = delete;

    // Stores a block's bytes under `key`, replacing what the key held (its leases move to
    // the new bytes; their holders keep the old view). Evicts the least recently used blocks
    // that are neither leased nor pinned until it fits. Errors: kResourceExhausted when it
    // cannot fit (larger than the capacity, or the rest is leased or pinned); nothing changes.
    Status put(uint64_t key, Bytes bytes);
    // The block under `key`, leased to `owner` until `deadline` (a hit), or kNotFound (a miss).
    Result<Lease> get(uint64_t key, std::string owner, Clock::time_point deadline);
    bool contains(uint64_t key) const;
    std::optional<uint64_t> size_of(uint64_t key) const;  // nullopt: not held
    // A block's bytes for a look (the tools): no lease, no hit counted, its place in the LRU
    // unchanged. Null when not held.
    Bytes peek(uint64_t key) const;
    std::vector<uint64_t> keys() const;
    // Drops a block (it failed verification, or an operator dropped it); leases on it end.
    void erase(uint64_t key);
    // A pinned block is never evicted. kNotFound for a key the tier does not hold.
    Status pin(uint64_t key);
    Status unpin(uint64_t key);
    // Ends the leases whose deadline is before `now`; how many.
    size_t reap_expired(Clock::time_point now);
    std::vector<LeaseInfo> leases() const;
    Stats stats() const;

  private:
    struct Block;
    struct State;
    std::shared_ptr<State> state_;
    std::thread janitor_;
};

// A lease on one block: the view of its bytes stays valid while this lives. Ending it (its
// destruction, or release()) lets the block be evicted again; after the janitor reaped it,
// that is a no-op. Move-only.
class HostTier::Lease {
  public:
    Lease() = default;
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&& other) noexcept;
    ~Lease();

    std::span<const uint8_t> bytes() const { return *bytes_; }
    uint64_t key() const { return key_; }
    // Whether it still holds the block against eviction (not released, not reaped).
    bool active() const;
    void release();

  private:
    friend class HostTier;
    std::shared_ptr<State> state_;
    uint64_t id_ = 0, key_ = 0;
    Bytes bytes_;
};

}  // namespace deltaserve::kvstore
