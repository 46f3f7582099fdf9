// A session's KV outside the decode worker's memory: the host tier and the disk tier of the
// tiered store (issue 36, DESIGN.md "One chat turn" step 6). A session's KV is stored as
// blocks (model/kv_blocks.h) and a record of which blocks, tokens and decode hints they hold.
//
// - persist(), at the end of each turn (write-through, when a disk tier is given): the
//   blocks whose bytes changed go to the host tier and to disk, and the record is committed
//   with the last of them, so the store names only whole blocks after a crash.
// - demote(), when an idle session leaves decode memory: its blocks go to the host tier
//   (nothing to do when persist() stored them since).
// - promote(), on a session's next turn when it is not in decode memory: the record (from
//   memory, or from disk after a restart) and as many leading blocks as the tiers still hold,
//   each checked (kv_block.h's checks, and its checksum against the record's) before use;
//   the rest of the history is prefilled again.
//
// Full KV's blocks depend on their tokens alone: they chain from the fingerprint, so sessions
// that start alike share them (and a block written once is not written again). Other
// policies' blocks depend on what came after them: they chain from a root scoped to the
// session, and the record's checksums keep blocks of two exports from ever being mixed.
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "deltaserve/decode/decode_worker.h"
#include "deltaserve/decode/session_record.h"
#include "deltaserve/decode/tier_stats.h"
#include "deltaserve/kvstore/device_tier.h"
#include "deltaserve/kvstore/disk_tier.h"
#include "deltaserve/kvstore/host_tier.h"
#include "deltaserve/kvstore/kv_policy.h"
#include "deltaserve/model/inference_context.h"

namespace deltaserve::decode {

class SessionTiers {
  public:
    struct Options {
        std::shared_ptr<kvstore::HostTier> host;  // required
        std::shared_ptr<kvstore::DiskTier> disk;  // null: no disk tier, no persist()
        // The device tier above the host tier (kvstore/device_tier.h), or null: every block
        // stored goes to both (a block is stored when either took it), and a take looks here
        // first.
        std::shared_ptr<kvstore::DeviceTier> device;
        uint64_t fingerprint = 0;  // what the KV depends on besides tokens
        kvstore::KvCodecId codec = kvstore::KvCodecId::kRows;
        int32_t block_tokens = 256;
        bool shared_prefix = false;  // blocks are a function of their tokens (full KV)
    };

    // Where promote() found the blocks: the slowest tier any came from.
    enum class Source { kDevice, kHost, kDisk };
    static std::string_view source_name(Source s) {
        return s == Source::kDevice ? "device" : s == Source::kHost ? "host" : "disk";
    }

    struct Promoted {
        std::vector<int32_t> tokens;
        Source source = Source::kHost;
    };

    explicit SessionTiers(Options options);

    bool persists() const { return options_.disk != nullptr; }
    // Stores the session's KV (ctx holds `tokens`) in the host tier and on disk, writing only
    // the blocks that changed since the last call. False when its export or the disk failed
    // (the service goes on; the session resumes from what is stored, or recomputes).
    // `scope` is the session's cache scope (its tenant): full KV's blocks are shared within one.
    bool persist(const std::string& session, const std::string& scope,
                 const model::InferenceContext& ctx, const std::vector<int32_t>& tokens,
                 int64_t now_ms);
    // Stores the session's KV in the host tier and remembers it. As many whole leading
    // blocks as fit are kept; false when none did (nothing is remembered then).
    bool demote(const std::string& session, const std::string& scope,
                const model::InferenceContext& ctx, const std::vector<int32_t>& tokens,
                int64_t now_ms);
    // The tokens the session's stored blocks hold (0: none), from memory or from disk.
    int32_t stored_tokens(const std::string& session);
    // What the tiers hold of the session: its record's tokens and blocks, and the bytes of
    // those blocks each tier holds (0 when none; false when there is no record).
    struct Held {
        int64_t tokens = 0, device_bytes = 0, host_bytes = 0, disk_bytes = 0;
        int32_t blocks = 0;
    };
    bool held(const std::string& session, Held* out) const;
    // The session's record, from memory or from disk (a look: not kept in memory).
    std::optional<SessionRecord> look(const std::string& session) const;
    uint64_t fingerprint() const { return options_.fingerprint; }
    // Where the blocks `keys` are: the tiers holding them and their leases.
    std::vector<StoredBlockPlace> places(const std::vector<uint64_t>& keys) const;
    // A block's first `limit` bytes (0: all), from the host tier or disk. kNotFound.
    Result<std::string> read_block(uint64_t key, uint64_t limit) const;
    // Forgets the session: its record here and on disk, and its own blocks.
    void forget(const std::string& session);
    // Forgets the records in memory last used before `cutoff_ms` (their blocks age out of
    // the host tier; a persisted session can still come back from disk).
    void forget_older_than(int64_t cutoff_ms);
    // Takes the session's blocks back into `ctx` (empty, made with the worker's options),
    // or nullopt when nothing came back. A block that fails its checks is dropped from the
    // tiers and the blocks before it are taken. When the context has no room for them, the
    // record stays for a later turn.
    std::optional<Promoted> promote(const std::string& session, const std::string& scope,
                                    model::InferenceContext& ctx, uint64_t turn_id);

    // Prefixes (full KV only): the tokens of `tokens`' leading whole blocks the tiers hold
    // under `scope` (a turn with no KV of its own starts from them; one token at least is
    // left to evaluate).
    int32_t prefix_held(std::span<const int32_t> tokens, const std::string& scope) const;
    // Takes those blocks into `ctx` (empty); nullopt when none came.
    std::optional<Promoted> load_prefix(std::span<const int32_t> tokens, const std::string& scope,
                                        model::InferenceContext& ctx, uint64_t turn_id);
    // Stores the whole blocks of ctx's first `upto` tokens (a prefix a turn found cached:
    // used twice), unless the tiers hold them already.
    void store_prefix(const std::string& scope, const model::InferenceContext& ctx,
                      const std::vector<int32_t>& tokens, int32_t upto);
    // What the tiers did for this worker: decode::TierStats' session, prefix and store
    // counters (its host and disk figures are the tiers' own: the worker adds them).
    TierStats stats() const;

    // A session's record: what its stored blocks hold (session_record.h).
    using Record = SessionRecord;

  private:
    // What a take of stored blocks found: how many leading ones came into the context, from
    // which tiers, what was missing or refused; `later`: they are fine but there was no room.
    struct Loaded {
        size_t blocks = 0;
        Source source = Source::kDevice;
        int64_t missing = 0, refused = 0;
        bool later = false;
    };
    Loaded load(const std::vector<uint64_t>& keys, const std::vector<uint32_t>& crcs,
                std::span<const uint8_t> hints, uint64_t root, model::InferenceContext& ctx,
                uint64_t turn_id);
    std::vector<uint64_t> prefix_keys(std::span<const int32_t> tokens,
                                      const std::string& scope) const;
    uint64_t root_of(const std::string& session, const std::string& scope) const;
    // A block from the device tier; nullopt without one, or a miss or device error there.
    std::optional<std::vector<uint8_t>> device_get(uint64_t key);
    // A block into the host and device tiers: whether either took it.
    bool put_above_disk(uint64_t key, const kvstore::HostTier::Bytes& bytes);
    // Drops a block from every tier (`refused`: it failed its checks).
    void erase_everywhere(uint64_t key, bool refused);
    std::string record_key(const std::string& session) const;
    // The record in memory, else on disk (into memory). Null when there is none; a record on
    // disk that does not parse is removed and counted. Under mu_.
    Record* find_locked(const std::string& session);

    const Options options_;
    mutable std::mutex mu_;
    std::map<std::string, Record> records_;
    TierStats stats_;
};

}  // namespace deltaserve::decode
