// A data dir's stores, opened for deltactl's offline views (ops/README.md): a stopped
// node's data dir, or a checkpoint of a live one. Never the files of a store a running server
// holds: open() refuses those, naming the server's process. Read-only unless `writable`
// (verify --drop), which only a stopped node's store allows.
//
// A data dir (deltaserve serve --data-dir, or a cluster's data_dir) holds one store per node:
// DIR/kv (serve: the decode worker's KV and the gateway's session records together), or
// DIR/<node>/kv (a cluster: each decode node's, and DIR/gateway/kv the gateway's records).
// DIR may also be a store itself (a kv folder, or a checkpoint).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "deltaserve/common/status.h"
#include "deltaserve/decode/session_record.h"
#include "deltaserve/kvstore/disk_tier.h"
#include "deltaserve/kvstore/kv_block.h"

namespace deltaserve::ops {

struct Store {
    std::string name;  // the node ("" for serve's single store)
    std::string dir;
    std::unique_ptr<kvstore::DiskTier> tier;
};

// A session as the stores know it: the gateway's record (what its owner sees) and the decode
// node's record of its stored KV, either of which may be missing.
struct StoredSession {
    std::string key;  // tenant/id
    std::string tenant, id;
    // How the tools name it: the id alone for a server without keys, else tenant/id.
    std::string name() const { return tenant.empty() ? id : key; }
    // The gateway's record (has_gateway_record): -1 / "" where not.
    bool has_gateway_record = false;
    std::string node;
    int32_t turns = -1, messages = -1;
    int64_t tokens = -1, last_used = 0;  // last use: unix seconds
    // The decode node's record (has_kv_record): its blocks' keys, ends and checksums.
    bool has_kv_record = false;
    const Store* store = nullptr;
    uint64_t fingerprint = 0;
    decode::SessionRecord record;
    // Records of the session under other KV identities (another model, tokenizer, profile
    // or policy wrote them): a server uses only its own.
    std::vector<uint64_t> other_fingerprints;
    uint64_t disk_bytes = 0;  // of its blocks the index holds
    int32_t blocks_held = 0;  // of record.keys
};

// A block's header, read from the first bytes of its file.
struct BlockHead {
    const Store* store = nullptr;
    kvstore::DiskTier::BlockEntry entry;
    std::optional<kvstore::KvBlockMeta> meta;  // nullopt: the header did not parse
    std::string fault;                         // why, then
};

class StoreView {
  public:
    // Errors: kNotFound (no store under data_dir), kFailedPrecondition (a running server
    // holds one: its pid is named), kDataLoss (a damaged store: deltactl repair is named),
    // kUnavailable (a store that does not open).
    static Result<std::unique_ptr<StoreView>> open(const std::string& data_dir,
                                                   bool writable = false);

    const std::vector<std::unique_ptr<Store>>& stores() const { return stores_; }
    // Every session either kind of record names, by key. Records that do not parse are
    // counted in unreadable_records().
    std::vector<StoredSession> sessions();
    int64_t unreadable_records() const { return unreadable_; }
    // The session `key` (tenant/id), or an id alone when one tenant has it.
    Result<StoredSession> session(const std::string& key_or_id);
    // A block's whole bytes (kNotFound when its store does not hold it).
    Result<std::vector<uint8_t>> read_block(const Store& store, uint64_t key) const;
    // A block's header, read from the first bytes of its file (`fault`: why not).
    Result<kvstore::KvBlockMeta> read_header(const Store& store, uint64_t key,
                                             std::string* fault = nullptr) const;
    // Every block of every store with its header.
    std::vector<BlockHead> blocks() const;

  private:
    std::vector<std::unique_ptr<Store>> stores_;
    int64_t unreadable_ = 0;
};

// The stores under a data dir (see above) as (node name, store dir): DIR itself, DIR/kv, or
// DIR/<node>/kv. kNotFound when there is none.
Result<std::vector<std::pair<std::string, std::string>>> find_stores(const std::string& data_dir);

// A block's header parsed with its own fingerprint (the tools read any store): every check
// of parse_kv_block_header but the fingerprint's. `fault` names what failed.
Result<kvstore::KvBlockMeta> parse_any_block_header(std::span<const uint8_t> bytes,
                                                    std::string* fault = nullptr);
Result<kvstore::KvBlockView> parse_any_block(std::span<const uint8_t> bytes,
                                             std::string* fault = nullptr);

}  // namespace deltaserve::ops
