// Idle sessions demoted from the decode worker's KV memory to the host tier of the tiered
// store and promoted back (issue 36, DESIGN.md "One chat turn" step 6). A demoted session's
// KV is stored as blocks (model/kv_blocks.h) chained from a root scoped to the session;
// the worker keeps only the record of which blocks and tokens. Its next turn takes back as
// many blocks as the tier still holds, in order, each checked before use; the rest of the
// history is prefilled again, as it was before the tiers. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "deltaserve/kvstore/host_tier.h"
#include "deltaserve/kvstore/kv_policy.h"
#include "deltaserve/model/inference_context.h"

namespace deltaserve::decode {

class SessionTiers {
  public:
    struct Stats {
        int64_t demoted = 0, promoted = 0, promoted_tokens = 0;
        int64_t demote_failed = 0;   // nothing of the session fit, or its export failed
        int64_t blocks_missing = 0;  // evicted from the tier before the session came back
        int64_t blocks_refused = 0;  // failed their checks: dropped, recomputed
    };

    SessionTiers(std::shared_ptr<kvstore::HostTier> host, uint64_t fingerprint,
                 kvstore::KvCodecId codec, int32_t block_tokens);

    // Stores the session's KV (ctx holds `tokens`) and remembers it. As many whole leading
    // blocks as fit are kept; false when none did (nothing is remembered then).
    bool demote(const std::string& session, const model::InferenceContext& ctx,
                const std::vector<int32_t>& tokens, int64_t now_ms);
    bool has(const std::string& session) const;
    // The tokens a demoted session's blocks hold (0: none).
    int32_t stored_tokens(const std::string& session) const;
    void forget(const std::string& session);
    // Forgets the records last used before `cutoff_ms` (their blocks age out of the tier).
    void forget_older_than(int64_t cutoff_ms);
    // Takes the session's blocks back into `ctx` (empty, made with the worker's options) and
    // returns the tokens they hold, or nullopt when nothing came back. A block that fails its
    // checks is dropped from the tier and the blocks before it are taken; the record is used
    // up then. When the context has no room for them, the record stays for a later turn.
    std::optional<std::vector<int32_t>> promote(const std::string& session,
                                                model::InferenceContext& ctx, uint64_t turn_id);
    Stats stats() const;

  private:
    struct Record {
        std::vector<uint64_t> keys;
        std::vector<int32_t> ends;  // each block's end
        std::vector<int32_t> tokens;
        std::vector<uint8_t> hints;  // with every block only
        int64_t last_used = 0;
    };

    uint64_t root_of(const std::string& session) const;

    const std::shared_ptr<kvstore::HostTier> host_;
    const uint64_t fingerprint_;
    const kvstore::KvCodecId codec_;
    const int32_t block_tokens_;
    mutable std::mutex mu_;
    std::map<std::string, Record> records_;
    Stats stats_;
};

}  // namespace deltaserve::decode
