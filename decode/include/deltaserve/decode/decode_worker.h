// The decode worker (DESIGN.md "One chat turn", steps 3 and 5): holds chat sessions' KV
// between turns, takes a turn's KV from a prefill node (or prefills a short append itself),
// and generates for every running turn together, one token each per forward pass
// (continuous batching: turns join and leave between steps; prompts prefilled here join the
// same passes a chunk at a time).
//
// A turn starts with start_turn(): the worker compares the prompt with the tokens its session
// already holds and says what remains to prefill. Up to local_prefill_max uncached tokens are
// prefilled here; beyond that the gateway asks a prefill node, which pulls the session's
// cached KV from this worker (a kPull on the data connection), prefills the new tokens and
// ships the whole session back (transport/kv_stream.h), layer by layer; the turn is admitted
// once every layer arrived and generates from the first token the prefill node sampled.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

#include "deltaserve/common/status.h"
#include "deltaserve/decode/tier_stats.h"
#include "deltaserve/decode/turn.h"
#include "deltaserve/kvstore/device_tier.h"
#include "deltaserve/kvstore/disk_tier.h"
#include "deltaserve/kvstore/host_tier.h"
#include "deltaserve/model/inference_context.h"
#include "deltaserve/model/model.h"
#include "deltaserve/transport/transport.h"

namespace deltaserve::decode {

struct DecodeOptions {
    // How each session's context is made (its threads are the worker's pool).
    model::ContextOptions context;
    int threads = 0;  // the worker's pool; 0 = one per hardware thread
    // KV memory of the node in bytes: the sessions kept between turns, the running turns and
    // the prefix cache share it. Full KV's blocks come from one kvstore::BlockPool of this
    // size (address space until used); other policies' caches are counted by their bytes. A
    // turn is booked the most its KV can grow to (its prompt and max_tokens, or the context)
    // before it starts: idle sessions are dropped for it, least recently used first, and
    // when running turns have booked too much it is refused (kResourceExhausted: HTTP 429).
    // 0 = a quarter of the machine's physical memory.
    size_t kv_memory = 0;
    int32_t max_sessions = 1024;        // sessions kept between turns (least recent dropped)
    int64_t session_ttl_ms = 3600'000;  // idle sessions are dropped after this
    int32_t max_batch = 32;             // turns per forward pass
    int32_t local_prefill_max = 512;    // uncached prompt tokens prefilled here, at most
    // Prompt tokens per forward pass next to the running turns (a step's token budget for
    // prefill; a prompt delays the others' next token by one such chunk at most). 128 by
    // measurement (bench/README.md, "Choosing the prefill chunk": 512 doubled the
    // inter-token p99 for the same throughput); 0 = context.n_batch (as a prefill node).
    int32_t prefill_chunk = 128;
    // A turn waiting for its KV fails when none of it came for this long: from the turn's
    // start (the prefill's queue and its first chunk), then from each message of its stream.
    int64_t kv_wait_ms = 120'000;
    // Automatic prefix caching (decode/src/prefix_cache.h): bytes of KV blocks kept for any
    // later prompt that starts the same way; 0 = off. Only for caches whose prefixes are exact
    // (full KV); other policies reuse a session's own KV only.
    size_t prefix_cache_bytes = size_t{1} << 30;
    int32_t max_data_connections = 256;  // prefill nodes' connections at once; more are closed
    // The cluster secret a data connection's peer must prove first (decode/kv_stream_io.h's
    // handshake); "" = none (every peer proves the empty secret).
    std::string cluster_token;
    std::string model_id;    // shipments for another model are refused
    std::string profile_id;  // ... or another compression profile
    // The host tier of the tiered store (kvstore/host_tier.h), or null. An idle session
    // dropped from KV memory (for a turn's room, by TTL or by count) is demoted there as
    // stored blocks of tier_block_tokens (model/kv_blocks.h), and its next turn takes them
    // back instead of prefilling its history again; a block the tier no longer holds, or one
    // that fails its checks, is recomputed. For policies whose KV is storable.
    std::shared_ptr<kvstore::HostTier> host_tier;
    // The disk tier (kvstore/disk_tier.h), or null. With one, every session's KV is stored
    // at the end of each turn (write-through: the blocks that changed, to the host tier and
    // to disk, before the turn's end is reported), and a session this worker does not hold
    // (after a restart) comes back from disk.
    std::shared_ptr<kvstore::DiskTier> disk_tier;
    // The device tier (kvstore/device_tier.h), or null: above the host tier, in a device's
    // memory; every block stored goes there too, and a session's next turn looks there first.
    std::shared_ptr<kvstore::DeviceTier> device_tier;
    // Where checkpoint(name) puts the disk tier's copy: ROOT/checkpoints/<name>/STORE/kv, the
    // layout of the data dir it came from (serve: ROOT/kv, STORE ""; a cluster's decode
    // node: ROOT/<node>/kv, STORE its name), so that deltactl reads it as one.
    std::string checkpoint_root, checkpoint_store;
    // Tokens per stored block: a prefix is found in the tiers by whole blocks. 64 by
    // measurement (bench/README.md, "The tiered store": a 2k-token system prompt came back
    // 25x faster than prefilling it with 64, 6x with 256, whose last partial block was
    // prefilled again; sessions resumed as fast).
    int32_t tier_block_tokens = 64;
    // What stored KV depends on besides model_id and profile_id: the identity of the weights,
    // the tokenizer and the profile's contents (the CLI hashes the files). Stored blocks of
    // another store_id are refused.
    std::string store_id;
};

// What start_turn found: how much of the prompt is cached here, and whether a prefill node
// must compute the rest (then with the session's history pulled from here when pull_tokens
// > 0).
struct TurnPlan {
    int32_t cached_tokens = 0;
    bool remote_prefill = false;
    int32_t pull_tokens = 0;
};

struct DecodeStats {
    int64_t sessions = 0;   // kept between turns
    int64_t running = 0;    // turns generating
    int64_t waiting = 0;    // turns waiting for their KV or a local prefill
    int64_t kv_bytes = 0;   // held by sessions and turns (whole blocks for paged KV)
    int64_t kv_memory = 0;  // the budget (DecodeOptions::kv_memory)
    int64_t kv_booked = 0;  // booked by the turns not ended
    // Full KV: bytes of the block pool in use (sessions, turns and the prefix cache; a block
    // that several hold counts once) and the most in use at once so far.
    int64_t kv_pool_used = 0;
    int64_t kv_pool_peak = 0;
    double keep_ratio = 1.0;  // the KV bytes the caches keep over the same tokens in fp16 full KV
    int64_t kv_bytes_received = 0;
    int64_t turns = 0;               // ended, in any way
    int64_t prefix_cache_bytes = 0;  // the prefix cache's blocks (not in kv_bytes)
    int64_t prefix_cache_blocks = 0;
    int64_t prefix_cache_hit_tokens = 0;  // prompt tokens taken from it, in all
    TierStats tiers;                      // the tiered store (host_tier, disk_tier)
};

// Where one session's KV is on this node, for the operators' views (deltactl sessions): -1
// (or NaN, "") where not known. A session whose turn runs has its context in the turn: its
// decode figures are not read then.
struct SessionKv {
    std::string id;
    bool running = false;
    int64_t tokens = -1;        // in decode memory
    int64_t decode_bytes = -1;  // held in decode memory
    double keep_ratio = std::nan("");
    std::string policy;          // the node's KV policy
    int64_t stored_tokens = -1;  // in the host and disk tiers (its record)
    int64_t device_bytes = -1, host_bytes = -1, disk_bytes = -1;
    int32_t blocks = -1;  // its record's blocks
    bool pinned = false;  // kept in decode memory (pin_session)
};

// Where each of a session's stored blocks is now, for deltactl session describe on a running
// node: the tiers that hold it and who leases it.
struct StoredBlockPlace {
    uint64_t key = 0;
    int64_t device_bytes = -1, host_bytes = -1, disk_bytes = -1;  // -1: that tier does not hold it
    struct Holder {
        std::string owner;  // "turn N", or a transfer
        double seconds_left = 0.0;
    };
    std::vector<Holder> leases;
};
struct SessionBlocks {
    std::string record;  // its stored record (session_record.h), encoded
    uint64_t fingerprint = 0;
    std::vector<StoredBlockPlace> blocks;  // of the record's keys, in order
};

// A checkpoint's name: 1-64 of A-Z a-z 0-9 . _ - (not "." or ".."). kInvalidArgument else.
Status check_checkpoint_name(const std::string& name);

class DecodeWorker {
  public:
    // Errors: kInvalidArgument for options the model cannot take.
    static Result<std::unique_ptr<DecodeWorker>> create(const model::Model& model,
                                                        DecodeOptions options);
    // Ends every turn that has not ended (kUnavailable) and closes the data connections.
    virtual ~DecodeWorker() = default;

    // Registers a turn. The sink hears its pieces and its end, from the worker's threads.
    // Errors: kFailedPrecondition when the session already has a running turn,
    // kOutOfRange when the prompt does not fit in the context, kInvalidArgument for an
    // empty prompt or a turn id in use, kResourceExhausted when the node's KV memory cannot
    // take the turn (now, or ever: the message says which).
    virtual Result<TurnPlan> start_turn(TurnSpec spec, std::shared_ptr<TurnSink> sink) = 0;
    // Ends a turn early: "cancelled" when it was generating, else the given error (a
    // prefill that failed). Unknown or ended turns are ignored.
    virtual void cancel(uint64_t turn_id, Status why) = 0;
    // Serves a data connection from a prefill node (KV streams in, history pulls out) on a
    // thread of its own until the connection closes or the worker stops.
    virtual void serve(std::unique_ptr<transport::Connection> connection) = 0;
    // Listens for prefill nodes' data connections on `address` and serves each; returns the
    // address they connect to (the real port when given port 0). Once per worker.
    virtual Result<std::string> listen(transport::Transport& transport,
                                       const std::string& address) = 0;
    // Drops a session's KV (the next turn recomputes it). Unknown ids are ignored.
    virtual void drop_session(const std::string& session_id) = 0;
    virtual DecodeStats stats() const = 0;
    // Each session's KV (SessionKv; ids it does not know get -1s), the worker's lock held
    // once for them all: callers ask a page at a time.
    virtual std::vector<SessionKv> session_kv(const std::vector<std::string>& ids) const = 0;
    // The session's stored record and where each of its blocks is (the tiers' locks only,
    // never the loop's). Errors: kNotFound (nothing stored), kFailedPrecondition (no tiers).
    virtual Result<SessionBlocks> session_blocks(const std::string& session_id) const = 0;
    // A stored block's bytes, the first `limit` of them (0: all), from the host tier or disk,
    // without a lease or a hit counted. Errors: kNotFound.
    virtual Result<std::string> read_block(uint64_t key, uint64_t limit) const = 0;
    // A copy of the disk tier for the tools (kvstore::DiskTier::checkpoint), named `name`
    // (1-64 of A-Z a-z 0-9 . _ -): its folder. Errors: kInvalidArgument (the name),
    // kFailedPrecondition (no disk tier), kAlreadyExists, kUnavailable.
    virtual Result<std::string> checkpoint(const std::string& name) const = 0;
    // Takes an idle session's KV out of decode memory into the tiers (as the LRU does;
    // nothing to write when its turns were stored as they ended): its next turn promotes it.
    // Errors: kNotFound (not in decode memory), kFailedPrecondition (a turn runs for it).
    virtual Status evict_session(const std::string& session_id) = 0;
    // A pinned session's KV stays in decode memory: neither its TTL, the session count nor
    // the room other turns need drops it (a turn that would need its memory is refused); an
    // evict or a drop ends the pin. A session out of decode memory whose KV the tiers hold is
    // brought back first (its turns' cache scope: `scope`), as its next turn would. Errors:
    // kNotFound (neither decode memory nor the tiers hold it).
    virtual Status pin_session(const std::string& session_id, bool pinned,
                               const std::string& scope) = 0;
};

}  // namespace deltaserve::decode
