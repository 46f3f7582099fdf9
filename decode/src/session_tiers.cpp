#include "session_tiers.h"

#include <chrono>

#include "deltaserve/common/chain_hash.h"
#include "deltaserve/common/logging.h"
#include "deltaserve/kvstore/kv_block.h"
#include "deltaserve/model/kv_blocks.h"

namespace deltaserve::decode {

namespace {

// A demoted session's blocks stay leased while its turn imports them, at most this long.
constexpr std::chrono::seconds kLease{30};

}  // namespace

SessionTiers::SessionTiers(std::shared_ptr<kvstore::HostTier> host, uint64_t fingerprint,
                           kvstore::KvCodecId codec, int32_t block_tokens)
    : host_(std::move(host)),
      fingerprint_(fingerprint),
      codec_(codec),
      block_tokens_(block_tokens) {}

uint64_t SessionTiers::root_of(const std::string& session) const {
    return hash_string(fingerprint_, "session:" + session);
}

bool SessionTiers::demote(const std::string& session, const model::InferenceContext& ctx,
                          const std::vector<int32_t>& tokens, int64_t now_ms) {
    model::KvBlocksOptions o{fingerprint_, root_of(session), block_tokens_, codec_};
    auto exported = model::export_kv_blocks(ctx, tokens, o);
    std::lock_guard lock(mu_);
    if (!exported.ok()) {
        ++stats_.demote_failed;
        spdlog::warn("decode: session {} could not be demoted: {}", session,
                     exported.status().to_string());
        return false;
    }
    Record r;
    for (auto& bytes : exported->blocks) {
        auto meta = kvstore::parse_kv_block_header(bytes, fingerprint_);
        if (!meta.ok()) break;
        const uint64_t key = meta->key;
        const int32_t end = meta->end;
        if (!host_->put(key, std::make_shared<const std::vector<uint8_t>>(std::move(bytes))).ok())
            break;  // the rest would not chain: keep the leading blocks that fit
        r.keys.push_back(key);
        r.ends.push_back(end);
    }
    if (r.keys.empty()) {
        ++stats_.demote_failed;
        records_.erase(session);
        return false;
    }
    r.tokens.assign(tokens.begin(), tokens.begin() + r.ends.back());
    if (r.keys.size() == exported->blocks.size()) r.hints = std::move(exported->hints);
    r.last_used = now_ms;
    records_[session] = std::move(r);
    ++stats_.demoted;
    return true;
}

int32_t SessionTiers::stored_tokens(const std::string& session) const {
    std::lock_guard lock(mu_);
    auto it = records_.find(session);
    return it == records_.end() ? 0 : static_cast<int32_t>(it->second.tokens.size());
}

bool SessionTiers::has(const std::string& session) const {
    std::lock_guard lock(mu_);
    return records_.count(session) != 0;
}

void SessionTiers::forget(const std::string& session) {
    std::lock_guard lock(mu_);
    records_.erase(session);
}

void SessionTiers::forget_older_than(int64_t cutoff_ms) {
    std::lock_guard lock(mu_);
    for (auto it = records_.begin(); it != records_.end();)
        it = it->second.last_used < cutoff_ms ? records_.erase(it) : std::next(it);
}

std::optional<std::vector<int32_t>> SessionTiers::promote(const std::string& session,
                                                          model::InferenceContext& ctx,
                                                          uint64_t turn_id) {
    Record r;
    {
        std::lock_guard lock(mu_);
        auto it = records_.find(session);
        if (it == records_.end()) return std::nullopt;
        r = std::move(it->second);
        records_.erase(it);
    }
    // Leases on the blocks still there, in order, until the first that is gone.
    const auto deadline = kvstore::HostTier::Clock::now() + kLease;
    const std::string owner = "turn " + std::to_string(turn_id);
    std::vector<kvstore::HostTier::Lease> leases;
    for (uint64_t key : r.keys) {
        auto lease = host_->get(key, owner, deadline);
        if (!lease.ok()) break;
        leases.push_back(std::move(*lease));
    }
    int64_t missing = static_cast<int64_t>(r.keys.size() - leases.size());
    model::KvBlocksOptions o{fingerprint_, root_of(session), block_tokens_, codec_};
    size_t n = leases.size();
    int64_t refused = 0;
    while (n > 0) {
        std::vector<std::span<const uint8_t>> blocks;
        for (size_t i = 0; i < n; ++i) blocks.push_back(leases[i].bytes());
        int32_t bad = -1;
        const bool all = n == r.keys.size();
        const Status s = model::import_kv_blocks(
            ctx, blocks, all ? std::span<const uint8_t>(r.hints) : std::span<const uint8_t>(), o,
            &bad);
        if (s.ok()) break;
        if (s.code() != StatusCode::kDataLoss && s.code() != StatusCode::kFailedPrecondition) {
            // No room, or no context for it: the blocks are fine, the record stays.
            spdlog::info("decode: session {}: stored KV not taken back now: {}", session,
                         s.to_string());
            std::lock_guard lock(mu_);
            stats_.blocks_missing += missing;
            records_.emplace(session, std::move(r));
            return std::nullopt;
        }
        spdlog::warn("decode: session {}: stored KV refused ({}); recomputing from there", session,
                     s.to_string());
        if (bad < 0 || static_cast<size_t>(bad) >= n) {
            n = 0;
            break;
        }
        host_->erase(r.keys[static_cast<size_t>(bad)]);
        ++refused;
        n = static_cast<size_t>(bad);
    }
    std::lock_guard lock(mu_);
    stats_.blocks_missing += missing;
    stats_.blocks_refused += refused;
    if (n == 0) return std::nullopt;
    ++stats_.promoted;
    const int32_t end = r.ends[n - 1];
    stats_.promoted_tokens += end;
    return std::vector<int32_t>(r.tokens.begin(), r.tokens.begin() + end);
}

SessionTiers::Stats SessionTiers::stats() const {
    std::lock_guard lock(mu_);
    return stats_;
}

}  // namespace deltaserve::decode
