#include "session_tiers.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>

#include "deltaserve/common/chain_hash.h"
#include "deltaserve/common/crc32c.h"
#include "deltaserve/common/logging.h"
#include "deltaserve/kvstore/kv_block.h"
#include "deltaserve/model/kv_blocks.h"

namespace deltaserve::decode {

namespace {

// A demoted session's blocks stay leased while its turn imports them, at most this long.
constexpr std::chrono::seconds kLease{30};

// Where each turn of `tokens` (a session at a turn's end) ended: those of the last record,
// when the session goes on from it, then this turn's.
std::vector<int32_t> turns_after(const SessionRecord& before, const std::vector<int32_t>& tokens) {
    std::vector<int32_t> ends;
    if (before.tokens.size() <= tokens.size() &&
        std::equal(before.tokens.begin(), before.tokens.end(), tokens.begin()))
        ends = before.turn_ends;
    if (ends.empty() || ends.back() < static_cast<int32_t>(tokens.size()))
        ends.push_back(static_cast<int32_t>(tokens.size()));
    return ends;
}

}  // namespace

SessionTiers::SessionTiers(Options options) : options_(std::move(options)) {}

uint64_t SessionTiers::root_of(const std::string& session, const std::string& scope) const {
    // Shared blocks are shared within a cache scope (a tenant) only, as the prefix cache's.
    if (options_.shared_prefix) return prefix_root(options_.fingerprint, scope);
    return hash_string(options_.fingerprint, "session:" + session);
}

std::string SessionTiers::record_key(const std::string& session) const {
    return session_record_key(options_.fingerprint, session);
}

SessionTiers::Record* SessionTiers::find_locked(const std::string& session) {
    auto it = records_.find(session);
    if (it != records_.end()) return &it->second;
    if (!options_.disk) return nullptr;
    const std::string key = record_key(session);
    auto bytes = options_.disk->get_record(key);
    if (!bytes.ok() || !bytes->has_value()) return nullptr;
    auto r = decode_session_record(**bytes);
    if (!r) {
        spdlog::warn("decode: session {}: its stored record does not parse; recomputing", session);
        ++stats_.blocks_refused;
        const kvstore::DiskTier::Record del[] = {{key, ""}};
        (void)options_.disk->put_records(del);
        return nullptr;
    }
    r->last_used = std::chrono::duration_cast<std::chrono::milliseconds>(
                       std::chrono::steady_clock::now().time_since_epoch())
                       .count();
    return &records_.emplace(session, std::move(*r)).first->second;
}

bool SessionTiers::persist(const std::string& session, const std::string& scope,
                           const model::InferenceContext& ctx, const std::vector<int32_t>& tokens,
                           int64_t now_ms) {
    if (!options_.disk || tokens.empty()) return false;
    const auto t0 = std::chrono::steady_clock::now();
    Record before;
    {
        std::lock_guard lock(mu_);
        if (Record* r = find_locked(session)) before = *r;
    }
    Record r;
    r.tokens = tokens;
    r.turn_ends = turns_after(before, tokens);
    r.last_used = now_ms;
    model::KvBlocksOptions o{options_.fingerprint, root_of(session, scope), options_.block_tokens,
                             options_.codec};
    // Full KV's whole blocks never change: those the last store named, and disk still holds,
    // are not exported again (a long session's turn writes its tail, not its history).
    if (options_.shared_prefix) {
        uint64_t key = o.root;
        const size_t b = static_cast<size_t>(options_.block_tokens);
        for (size_t i = 0; (i + 1) * b <= tokens.size() && i < before.keys.size(); ++i) {
            key = hash_tokens(key, std::span(tokens).subspan(i * b, b));
            const int32_t begin = i == 0 ? 0 : before.ends[i - 1];
            if (before.keys[i] != key || before.ends[i] - begin != options_.block_tokens ||
                !options_.disk->contains(key))
                break;
            r.keys.push_back(key);
            r.ends.push_back(before.ends[i]);
            r.crcs.push_back(0);
        }
        // The last block is exported whatever it is: the record is committed with it.
        if (r.keys.size() * b == tokens.size()) {
            r.keys.pop_back();
            r.ends.pop_back();
            r.crcs.pop_back();
        }
        o.first_block = static_cast<int32_t>(r.keys.size());
    }
    const size_t kept = r.keys.size();
    auto exported = model::export_kv_blocks(ctx, tokens, o);
    if (!exported.ok()) {
        std::lock_guard lock(mu_);
        ++stats_.persist_failed;
        spdlog::warn("decode: session {} could not be stored: {}", session,
                     exported.status().to_string());
        return false;
    }
    r.hints = std::move(exported->hints);
    int64_t written = 0, bytes = 0;
    Status st;
    const size_t n = kept + exported->blocks.size();
    const std::string rkey = record_key(session);
    for (size_t i = kept; i < n && st.ok(); ++i) {
        auto& block = exported->blocks[i - kept];
        auto meta = kvstore::parse_kv_block_header(block, options_.fingerprint);
        if (!meta.ok()) {
            st = meta.status();
            break;
        }
        const uint32_t crc = crc32c(block);
        r.keys.push_back(meta->key);
        r.ends.push_back(meta->end);
        r.crcs.push_back(options_.shared_prefix ? 0 : crc);
        const bool same = i < before.keys.size() && before.keys[i] == meta->key &&
                          (options_.shared_prefix || before.crcs[i] == crc);
        const bool last = i + 1 == n;
        // Full KV's blocks are the same for every writer: one stored already is kept.
        const bool stored = same || (options_.shared_prefix && options_.disk->contains(meta->key));
        if (stored && !last) continue;
        std::string record;
        if (last) record = encode_session_record(r);
        const kvstore::DiskTier::Record rec[] = {{rkey, std::move(record)}};
        if (stored) {
            st = options_.disk->put_records(rec);
            break;
        }
        (void)put_above_disk(meta->key, std::make_shared<const std::vector<uint8_t>>(block));
        st = options_.disk->put(meta->key, block,
                                last ? std::span<const kvstore::DiskTier::Record>(rec)
                                     : std::span<const kvstore::DiskTier::Record>());
        if (st.ok()) {
            ++written;
            bytes += static_cast<int64_t>(block.size());
        }
    }
    std::lock_guard lock(mu_);
    stats_.blocks_written += written;
    stats_.bytes_written += bytes;
    stats_.store_seconds.add(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (!st.ok()) {
        ++stats_.persist_failed;
        spdlog::warn("decode: session {} could not be stored: {}", session, st.to_string());
        // What disk holds is the last record committed: it names only whole blocks.
        records_.erase(session);
        return false;
    }
    ++stats_.sessions_persisted;
    // The session's own blocks this export no longer names (a tail block that grew, blocks
    // of an export before) are dead: nothing else chains from them.
    // Shared blocks stay (another session may name them, even a short tail: sessions that
    // began alike share it); they age out by the tiers' LRU.
    std::vector<uint64_t> dead;
    for (uint64_t key : options_.shared_prefix ? std::vector<uint64_t>() : before.keys) {
        if (std::find(r.keys.begin(), r.keys.end(), key) == r.keys.end()) dead.push_back(key);
    }
    records_[session] = std::move(r);
    for (uint64_t key : dead) erase_everywhere(key, /*refused=*/false);
    return true;
}

bool SessionTiers::demote(const std::string& session, const std::string& scope,
                          const model::InferenceContext& ctx, const std::vector<int32_t>& tokens,
                          int64_t now_ms) {
    {
        std::lock_guard lock(mu_);
        auto it = records_.find(session);
        // Stored at the end of its last turn: the tiers hold it already.
        if (it != records_.end() && it->second.tokens == tokens) {
            it->second.last_used = now_ms;
            ++stats_.sessions_demoted;
            return true;
        }
    }
    model::KvBlocksOptions o{options_.fingerprint, root_of(session, scope), options_.block_tokens,
                             options_.codec};
    auto exported = model::export_kv_blocks(ctx, tokens, o);
    std::lock_guard lock(mu_);
    if (!exported.ok()) {
        spdlog::warn("decode: session {} could not be demoted: {}", session,
                     exported.status().to_string());
        return false;
    }
    Record r;
    for (auto& bytes : exported->blocks) {
        auto meta = kvstore::parse_kv_block_header(bytes, options_.fingerprint);
        if (!meta.ok()) break;
        const uint64_t key = meta->key;
        const int32_t end = meta->end;
        const uint32_t crc = options_.shared_prefix ? 0 : crc32c(bytes);
        if (!put_above_disk(key, std::make_shared<const std::vector<uint8_t>>(std::move(bytes))))
            break;  // the rest would not chain: keep the leading blocks that fit
        r.keys.push_back(key);
        r.ends.push_back(end);
        r.crcs.push_back(crc);
    }
    if (r.keys.empty()) {
        spdlog::info("decode: session {} not demoted: the tiers have no room", session);
        records_.erase(session);
        return false;
    }
    r.tokens.assign(tokens.begin(), tokens.begin() + r.ends.back());
    {
        const auto it = records_.find(session);
        r.turn_ends = turns_after(it != records_.end() ? it->second : Record(), tokens);
        std::erase_if(r.turn_ends, [&](int32_t e) { return e > r.ends.back(); });
    }
    if (r.keys.size() == exported->blocks.size()) r.hints = std::move(exported->hints);
    r.last_used = now_ms;
    records_[session] = std::move(r);
    ++stats_.sessions_demoted;
    return true;
}

int32_t SessionTiers::stored_tokens(const std::string& session) {
    std::lock_guard lock(mu_);
    const Record* r = find_locked(session);
    return r == nullptr ? 0 : static_cast<int32_t>(r->tokens.size());
}

std::optional<SessionRecord> SessionTiers::look(const std::string& session) const {
    // A look, not a use: a record only on disk is read outside the lock and not kept (an
    // operator listing every session must not load every record into memory).
    {
        std::lock_guard lock(mu_);
        if (auto it = records_.find(session); it != records_.end()) return it->second;
    }
    if (!options_.disk) return std::nullopt;
    auto bytes = options_.disk->get_record(record_key(session));
    if (!bytes.ok() || !bytes->has_value()) return std::nullopt;
    return decode_session_record(**bytes);
}

std::vector<StoredBlockPlace> SessionTiers::places(const std::vector<uint64_t>& keys) const {
    std::vector<StoredBlockPlace> out(keys.size());
    std::map<uint64_t, std::vector<size_t>> at;
    for (size_t i = 0; i < keys.size(); ++i) {
        out[i].key = keys[i];
        out[i].host_bytes = static_cast<int64_t>(options_.host->size_of(keys[i]).value_or(-1));
        if (options_.device) {
            out[i].device_bytes =
                static_cast<int64_t>(options_.device->size_of(keys[i]).value_or(-1));
        }
        if (options_.disk)
            out[i].disk_bytes = static_cast<int64_t>(options_.disk->size_of(keys[i]).value_or(-1));
        at[keys[i]].push_back(i);
    }
    const auto now = kvstore::HostTier::Clock::now();
    for (const auto& l : options_.host->leases()) {
        auto it = at.find(l.key);
        if (it == at.end()) continue;
        for (size_t i : it->second)
            out[i].leases.push_back(
                {l.owner, std::chrono::duration<double>(l.deadline - now).count()});
    }
    return out;
}

Result<std::string> SessionTiers::read_block(uint64_t key, uint64_t limit) const {
    const uint64_t want = limit == 0 ? std::numeric_limits<uint64_t>::max() : limit;
    if (auto bytes = options_.host->peek(key)) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(want, bytes->size()));
        return std::string(reinterpret_cast<const char*>(bytes->data()), n);
    }
    if (options_.device) {
        if (auto bytes = options_.device->peek(key); bytes.ok()) {
            bytes->resize(static_cast<size_t>(std::min<uint64_t>(want, bytes->size())));
            return std::string(bytes->begin(), bytes->end());
        }
    }
    if (!options_.disk) return not_found("no block " + std::to_string(key) + " in the tiers");
    DS_ASSIGN_OR_RETURN(auto bytes, options_.disk->peek(key, want));
    return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

bool SessionTiers::held(const std::string& session, Held* out) const {
    auto r = look(session);
    if (!r) return false;
    out->tokens = static_cast<int64_t>(r->tokens.size());
    const std::vector<uint64_t>& keys = r->keys;
    out->blocks = static_cast<int32_t>(keys.size());
    for (uint64_t k : keys) {
        out->host_bytes += static_cast<int64_t>(options_.host->size_of(k).value_or(0));
        if (options_.device)
            out->device_bytes += static_cast<int64_t>(options_.device->size_of(k).value_or(0));
        if (options_.disk)
            out->disk_bytes += static_cast<int64_t>(options_.disk->size_of(k).value_or(0));
    }
    return true;
}

void SessionTiers::forget(const std::string& session) {
    Record r;
    {
        std::lock_guard lock(mu_);
        if (Record* found = find_locked(session)) r = std::move(*found);
        records_.erase(session);
    }
    if (options_.disk) {
        const kvstore::DiskTier::Record del[] = {{record_key(session), ""}};
        (void)options_.disk->put_records(del);
    }
    if (options_.shared_prefix) return;  // its blocks may be other sessions' too
    for (uint64_t key : r.keys) erase_everywhere(key, /*refused=*/false);
}

std::optional<std::vector<uint8_t>> SessionTiers::device_get(uint64_t key) {
    if (!options_.device) return std::nullopt;
    auto got = options_.device->get(key);
    if (!got.ok()) return std::nullopt;
    return std::move(*got);
}

bool SessionTiers::put_above_disk(uint64_t key, const kvstore::HostTier::Bytes& bytes) {
    const bool host = options_.host->put(key, bytes).ok();
    const bool device = options_.device && options_.device->put(key, *bytes).ok();
    return host || device;
}

void SessionTiers::erase_everywhere(uint64_t key, bool refused) {
    if (options_.device) options_.device->erase(key);
    options_.host->erase(key);
    if (options_.disk) options_.disk->erase(key, refused);
}

void SessionTiers::forget_older_than(int64_t cutoff_ms) {
    std::lock_guard lock(mu_);
    for (auto it = records_.begin(); it != records_.end();)
        it = it->second.last_used < cutoff_ms ? records_.erase(it) : std::next(it);
}

SessionTiers::Loaded SessionTiers::load(const std::vector<uint64_t>& keys,
                                        const std::vector<uint32_t>& crcs,
                                        std::span<const uint8_t> hints, uint64_t root,
                                        model::InferenceContext& ctx, uint64_t turn_id) {
    Loaded out;
    const auto t0 = std::chrono::steady_clock::now();
    // The blocks still held, in order, until the first that is gone: copied from the device
    // tier, else leased in the host tier, else read from disk (and offered to the tiers
    // above for next time).
    const auto deadline = kvstore::HostTier::Clock::now() + kLease;
    const std::string owner = "turn " + std::to_string(turn_id);
    std::vector<kvstore::HostTier::Lease> leases;
    std::vector<kvstore::HostTier::Bytes> read, from_device;
    std::vector<std::span<const uint8_t>> blocks;
    // The slowest tier a block came from so far.
    const auto came_from = [&out](Source s) { out.source = std::max(out.source, s); };
    for (size_t i = 0; i < keys.size(); ++i) {
        std::span<const uint8_t> bytes;
        if (auto on_device = device_get(keys[i])) {
            from_device.push_back(
                std::make_shared<const std::vector<uint8_t>>(std::move(*on_device)));
            bytes = *from_device.back();
        } else if (auto lease = options_.host->get(keys[i], owner, deadline); lease.ok()) {
            came_from(Source::kHost);
            leases.push_back(std::move(*lease));
            bytes = leases.back().bytes();
            // Offered to the device tier for next time.
            if (options_.device) (void)options_.device->put(keys[i], bytes);
        } else if (options_.disk) {
            auto got = options_.disk->get(keys[i]);
            if (!got.ok()) break;
            came_from(Source::kDisk);
            read.push_back(std::make_shared<const std::vector<uint8_t>>(std::move(*got)));
            bytes = *read.back();
        } else {
            break;
        }
        if (crcs[i] != 0 && crc32c(bytes) != crcs[i]) {
            // Another export's block under the same key: never mixed with this record's.
            ++out.refused;
            break;
        }
        blocks.push_back(bytes);
    }
    out.missing = static_cast<int64_t>(keys.size() - blocks.size()) - out.refused;
    model::KvBlocksOptions o{options_.fingerprint, root, options_.block_tokens, options_.codec};
    size_t n = blocks.size();
    while (n > 0) {
        int32_t bad = -1;
        const bool all = n == keys.size();
        const Status s = model::import_kv_blocks(ctx, std::span(blocks.data(), n),
                                                 all ? hints : std::span<const uint8_t>(), o, &bad);
        if (s.ok()) break;
        if (s.code() != StatusCode::kDataLoss && s.code() != StatusCode::kFailedPrecondition) {
            // No room, or no context for it: the blocks are fine.
            spdlog::info("decode: stored KV not taken back now: {}", s.to_string());
            out.later = true;
            n = 0;
            break;
        }
        spdlog::warn("decode: stored KV refused ({}); recomputing from there", s.to_string());
        if (bad < 0 || static_cast<size_t>(bad) >= n) {
            n = 0;
            break;
        }
        erase_everywhere(keys[static_cast<size_t>(bad)], /*refused=*/true);
        ++out.refused;
        n = static_cast<size_t>(bad);
    }
    // What came from disk is offered to the tiers above: the next turn finds it there.
    for (const auto& bytes : read) {
        auto meta = kvstore::parse_kv_block_header(*bytes, options_.fingerprint);
        if (meta.ok()) (void)put_above_disk(meta->key, bytes);
    }
    out.blocks = n;
    std::lock_guard lock(mu_);
    if (n > 0) {
        stats_.load_seconds.add(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    stats_.blocks_missing += out.missing;
    stats_.blocks_refused += out.refused;
    return out;
}

std::optional<SessionTiers::Promoted> SessionTiers::promote(const std::string& session,
                                                            const std::string& scope,
                                                            model::InferenceContext& ctx,
                                                            uint64_t turn_id) {
    Record r;
    {
        std::lock_guard lock(mu_);
        Record* found = find_locked(session);
        if (found == nullptr) return std::nullopt;
        r = std::move(*found);
        records_.erase(session);
    }
    const Loaded got = load(r.keys, r.crcs, r.hints, root_of(session, scope), ctx, turn_id);
    std::lock_guard lock(mu_);
    if (got.later) {  // the record stays for a later turn
        records_.emplace(session, std::move(r));
        return std::nullopt;
    }
    if (got.blocks == 0) return std::nullopt;
    ++(got.source == Source::kDisk   ? stats_.promoted_disk
       : got.source == Source::kHost ? stats_.promoted_host
                                     : stats_.promoted_device);
    const int32_t end = r.ends[got.blocks - 1];
    stats_.promoted_tokens += end;
    Promoted out{std::vector<int32_t>(r.tokens.begin(), r.tokens.begin() + end), got.source};
    // A persisted session's record stays: the tiers still hold its blocks.
    if (options_.disk && got.blocks == r.keys.size()) records_.emplace(session, std::move(r));
    return out;
}

std::vector<uint64_t> SessionTiers::prefix_keys(std::span<const int32_t> tokens,
                                                const std::string& scope) const {
    if (!options_.shared_prefix) return {};
    // At least one token is left to evaluate: the turn needs its logits.
    std::vector<uint64_t> keys =
        prefix_chain(options_.fingerprint, scope, tokens, options_.block_tokens);
    const auto held = [&](uint64_t key) {
        return (options_.device && options_.device->contains(key)) ||
               options_.host->contains(key) || (options_.disk && options_.disk->contains(key));
    };
    keys.erase(std::find_if_not(keys.begin(), keys.end(), held), keys.end());
    return keys;
}

int32_t SessionTiers::prefix_held(std::span<const int32_t> tokens, const std::string& scope) const {
    return static_cast<int32_t>(prefix_keys(tokens, scope).size()) * options_.block_tokens;
}

std::optional<SessionTiers::Promoted> SessionTiers::load_prefix(std::span<const int32_t> tokens,
                                                                const std::string& scope,
                                                                model::InferenceContext& ctx,
                                                                uint64_t turn_id) {
    const std::vector<uint64_t> keys = prefix_keys(tokens, scope);
    if (keys.empty()) return std::nullopt;
    const Loaded got =
        load(keys, std::vector<uint32_t>(keys.size(), 0), {}, root_of("", scope), ctx, turn_id);
    if (got.blocks == 0) return std::nullopt;
    const int32_t end = static_cast<int32_t>(got.blocks) * options_.block_tokens;
    std::lock_guard lock(mu_);
    ++(got.source == Source::kDisk   ? stats_.prefix_disk
       : got.source == Source::kHost ? stats_.prefix_host
                                     : stats_.prefix_device);
    stats_.prefix_tokens += end;
    return Promoted{std::vector<int32_t>(tokens.begin(), tokens.begin() + end), got.source};
}

void SessionTiers::store_prefix(const std::string& scope, const model::InferenceContext& ctx,
                                const std::vector<int32_t>& tokens, int32_t upto) {
    if (!options_.shared_prefix || upto < options_.block_tokens) return;
    const int32_t whole = upto / options_.block_tokens * options_.block_tokens;
    // Already stored (another turn with the same prefix): nothing to export; the blocks held
    // are not exported again.
    const int32_t held =
        prefix_held(std::span(tokens).first(static_cast<size_t>(whole) + 1), scope);
    if (held >= whole) return;
    model::KvBlocksOptions o{options_.fingerprint, root_of("", scope), options_.block_tokens,
                             options_.codec};
    o.first_block = held / options_.block_tokens;
    auto exported = model::export_kv_blocks(ctx, tokens, o);
    if (!exported.ok()) return;
    int64_t written = 0, bytes = 0;
    for (auto& block : exported->blocks) {
        auto meta = kvstore::parse_kv_block_header(block, options_.fingerprint);
        if (!meta.ok() || meta->end > whole) break;
        if (options_.disk && options_.disk->contains(meta->key)) continue;
        auto shared = std::make_shared<const std::vector<uint8_t>>(std::move(block));
        (void)put_above_disk(meta->key, shared);
        if (options_.disk && options_.disk->put(meta->key, *shared).ok()) {
            ++written;
            bytes += static_cast<int64_t>(shared->size());
        }
    }
    std::lock_guard lock(mu_);
    stats_.blocks_written += written;
    stats_.bytes_written += bytes;
}

TierStats SessionTiers::stats() const {
    std::lock_guard lock(mu_);
    return stats_;
}

}  // namespace deltaserve::decode
