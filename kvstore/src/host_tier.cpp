// The host tier: blocks in memory under a byte budget, LRU with pins and leases.
#include "deltaserve/kvstore/host_tier.h"

#include <utility>

namespace deltaserve::kvstore {

struct HostTier::Block {
    Bytes bytes;
    std::list<uint64_t>::iterator lru;
    int32_t leases = 0;
    bool pinned = false;
};

struct HostTier::State {
    struct LeaseEntry {
        uint64_t key = 0;
        std::string owner;
        Clock::time_point deadline;
    };

    explicit State(const Options& o) : options(o) {}

    void end_lease_locked(uint64_t id) {
        auto it = leases.find(id);
        if (it == leases.end()) return;
        auto b = blocks.find(it->second.key);
        if (b != blocks.end()) --b->second.leases;
        leases.erase(it);
    }

    void drop_locked(std::unordered_map<uint64_t, Block>::iterator it) {
        bytes -= it->second.bytes->size();
        lru.erase(it->second.lru);
        blocks.erase(it);
    }

    size_t reap_locked(Clock::time_point now) {
        std::vector<uint64_t> expired;
        for (const auto& [id, lease] : leases) {
            if (lease.deadline < now) expired.push_back(id);
        }
        for (uint64_t id : expired) end_lease_locked(id);
        stats.leases_expired += expired.size();
        return expired.size();
    }

    const Options options;
    mutable std::mutex mu;
    std::condition_variable wake;
    bool stop = false;
    std::unordered_map<uint64_t, Block> blocks;
    std::list<uint64_t> lru;  // most recently used first
    std::unordered_map<uint64_t, LeaseEntry> leases;
    uint64_t next_lease = 1, bytes = 0;
    Stats stats;  // the counters
};

HostTier::HostTier(const Options& options) : state_(std::make_shared<State>(options)) {
    if (options.janitor_interval.count() > 0) {
        janitor_ = std::thread([s = state_] {
            std::unique_lock lock(s->mu);
            while (!s->stop) {
                s->wake.wait_for(lock, s->options.janitor_interval);
                if (!s->stop) s->reap_locked(Clock::now());
            }
        });
    }
}

HostTier::~HostTier() {
    {
        std::lock_guard lock(state_->mu);
        state_->stop = true;
    }
    state_->wake.notify_all();
    if (janitor_.joinable()) janitor_.join();
}

Status HostTier::put(uint64_t key, Bytes bytes) {
    if (bytes == nullptr) return invalid_argument("host tier: no bytes");
    State& s = *state_;
    std::lock_guard lock(s.mu);
    const uint64_t size = bytes->size();
    auto same = s.blocks.find(key);
    const uint64_t replaced = same != s.blocks.end() ? same->second.bytes->size() : 0;
    // Victims from the least recently used end, none taken unless all that is needed is.
    std::vector<uint64_t> victims;
    uint64_t held = s.bytes - replaced;
    for (auto it = s.lru.rbegin(); it != s.lru.rend() && held + size > s.options.capacity_bytes;
         ++it) {
        if (*it == key) continue;
        const Block& b = s.blocks.at(*it);
        if (b.leases > 0 || b.pinned) continue;
        victims.push_back(*it);
        held -= b.bytes->size();
    }
    if (held + size > s.options.capacity_bytes) {
        ++s.stats.refused;
        return resource_exhausted("host tier: a block of " + std::to_string(size) +
                                  " bytes does not fit (" + std::to_string(s.bytes) + " of " +
                                  std::to_string(s.options.capacity_bytes) +
                                  " held, the rest leased or pinned)");
    }
    for (uint64_t v : victims) s.drop_locked(s.blocks.find(v));
    s.stats.evictions += victims.size();
    ++s.stats.stores;
    if (same != s.blocks.end()) {
        s.bytes -= replaced;
        same->second.bytes = std::move(bytes);
        s.lru.splice(s.lru.begin(), s.lru, same->second.lru);
    } else {
        s.lru.push_front(key);
        Block b;
        b.bytes = std::move(bytes);
        b.lru = s.lru.begin();
        s.blocks.emplace(key, std::move(b));
    }
    s.bytes += size;
    return Status();
}

Result<HostTier::Lease> HostTier::get(uint64_t key, std::string owner, Clock::time_point deadline) {
    State& s = *state_;
    std::lock_guard lock(s.mu);
    auto it = s.blocks.find(key);
    if (it == s.blocks.end()) {
        ++s.stats.misses;
        return not_found("host tier: no block " + std::to_string(key));
    }
    ++s.stats.hits;
    Block& b = it->second;
    s.lru.splice(s.lru.begin(), s.lru, b.lru);
    ++b.leases;
    Lease lease;
    lease.state_ = state_;
    lease.id_ = s.next_lease++;
    lease.key_ = key;
    lease.bytes_ = b.bytes;
    s.leases.emplace(lease.id_, State::LeaseEntry{key, std::move(owner), deadline});
    return lease;
}

bool HostTier::contains(uint64_t key) const {
    std::lock_guard lock(state_->mu);
    return state_->blocks.count(key) != 0;
}

std::optional<uint64_t> HostTier::size_of(uint64_t key) const {
    std::lock_guard lock(state_->mu);
    auto it = state_->blocks.find(key);
    if (it == state_->blocks.end()) return std::nullopt;
    return it->second.bytes->size();
}

HostTier::Bytes HostTier::peek(uint64_t key) const {
    std::lock_guard lock(state_->mu);
    auto it = state_->blocks.find(key);
    return it == state_->blocks.end() ? nullptr : it->second.bytes;
}

std::vector<uint64_t> HostTier::keys() const {
    std::lock_guard lock(state_->mu);
    std::vector<uint64_t> out;
    out.reserve(state_->blocks.size());
    for (const auto& [key, b] : state_->blocks) out.push_back(key);
    return out;
}

void HostTier::erase(uint64_t key) {
    State& s = *state_;
    std::lock_guard lock(s.mu);
    auto it = s.blocks.find(key);
    if (it == s.blocks.end()) return;
    for (auto l = s.leases.begin(); l != s.leases.end();) {
        l = l->second.key == key ? s.leases.erase(l) : std::next(l);
    }
    s.drop_locked(it);
}

Status HostTier::pin(uint64_t key) {
    std::lock_guard lock(state_->mu);
    auto it = state_->blocks.find(key);
    if (it == state_->blocks.end()) return not_found("host tier: no block " + std::to_string(key));
    it->second.pinned = true;
    return Status();
}

Status HostTier::unpin(uint64_t key) {
    std::lock_guard lock(state_->mu);
    auto it = state_->blocks.find(key);
    if (it == state_->blocks.end()) return not_found("host tier: no block " + std::to_string(key));
    it->second.pinned = false;
    return Status();
}

size_t HostTier::reap_expired(Clock::time_point now) {
    std::lock_guard lock(state_->mu);
    return state_->reap_locked(now);
}

std::vector<HostTier::LeaseInfo> HostTier::leases() const {
    std::lock_guard lock(state_->mu);
    std::vector<LeaseInfo> out;
    for (const auto& [id, l] : state_->leases) out.push_back({l.key, l.owner, l.deadline});
    return out;
}

HostTier::Stats HostTier::stats() const {
    const State& s = *state_;
    std::lock_guard lock(s.mu);
    Stats out = s.stats;
    out.capacity = s.options.capacity_bytes;
    out.bytes = s.bytes;
    out.blocks = s.blocks.size();
    out.leases = s.leases.size();
    for (const auto& [key, b] : s.blocks) out.pinned += b.pinned;
    return out;
}

HostTier::Lease::Lease(Lease&& other) noexcept
    : state_(std::move(other.state_)),
      id_(std::exchange(other.id_, 0)),
      key_(other.key_),
      bytes_(std::move(other.bytes_)) {}

HostTier::Lease& HostTier::Lease::operator=(Lease&& other) noexcept {
    if (this != &other) {
        release();
        state_ = std::move(other.state_);
        id_ = std::exchange(other.id_, 0);
        key_ = other.key_;
        bytes_ = std::move(other.bytes_);
    }
    return *this;
}

HostTier::Lease::~Lease() { release(); }

bool HostTier::Lease::active() const {
    if (state_ == nullptr) return false;
    std::lock_guard lock(state_->mu);
    return state_->leases.count(id_) != 0;
}

void HostTier::Lease::release() {
    if (state_ == nullptr) return;
    {
        std::lock_guard lock(state_->mu);
        state_->end_lease_locked(id_);
    }
    state_.reset();
}

}  // namespace deltaserve::kvstore
