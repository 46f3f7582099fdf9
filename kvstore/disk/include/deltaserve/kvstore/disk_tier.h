// The disk tier of the tiered KV store (issue 36): stored KV blocks (kv_block.h bytes) on
// local disk under a byte cap, kept across restarts. Each block's bytes are one file under
// DIR/payload; the index (block key -> file generation, size, write order) and small records
// (the gateway's session records) live in RocksDB under DIR/index. A put writes the payload
// file first and then commits the index entry, the evictions it makes room with and any
// records given with it in one atomic WriteBatch, so after a crash (kill -9) the index names
// only whole files; open() recovers from the index alone and removes payload files no entry
// names (a put cut short). An I/O error (ENOSPC, EIO, a file size limit) makes the tier stop
// admitting; reads and everything else go on. Least recently written blocks go first when
// room is needed (reads reorder them until a restart). Each block removed (by the cap, as
// bad, by its owner, or found lost at open) is logged with the time and why, in the commit
// that removes it: the last Options::removals_kept, as records under "ev/" (removals()).
// Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "deltaserve/common/status.h"

namespace deltaserve::kvstore {

class DiskTier {
  public:
    struct Options {
        std::string dir;
        uint64_t capacity_bytes = 0;
        // fdatasync each payload and sync the index write before put returns: survives a
        // power loss, not only a process crash. Off by default.
        bool sync = false;
        // For the tools (deltactl) on a stopped node's store or a checkpoint: RocksDB opened
        // read-only, nothing created, removed or written (put, put_records and erase are
        // kFailedPrecondition or nothing; a bad file is reported, not dropped).
        bool read_only = false;
        // How many removals are logged (the oldest go).
        size_t removals_kept = 10000;
    };

    // A block as the index holds it.
    struct BlockEntry {
        uint64_t key = 0, bytes = 0;
        uint64_t order = 0;   // write order (reads move a block up until a restart)
        int64_t mtime_s = 0;  // its payload file's modification time (unix seconds)
    };

    struct Stats {
        uint64_t capacity = 0, bytes = 0, blocks = 0;
        uint64_t stores = 0, refused = 0, evictions = 0, hits = 0, misses = 0;
        uint64_t io_errors = 0, dropped = 0;
        bool admitting = true;
        std::string last_error;  // the I/O error that stopped admission
        // What open() found: the time it took, payload files no index entry named (removed)
        // and entries whose file was gone (removed).
        double recovery_ms = 0.0;
        uint64_t orphans_removed = 0, entries_lost = 0;
    };

    using Record = std::pair<std::string, std::string>;

    // A block the tier removed, and why: "cap" (the least recently written, to make room),
    // "refused" (a reader found it bad), "erased" (its owner dropped it), "lost" (its file
    // was gone at open).
    struct Removal {
        uint64_t key = 0, bytes = 0;
        int64_t unix_ms = 0;
        std::string reason;
    };

    // Opens (creating) the tier in options.dir and recovers its index. Errors: kUnavailable
    // when the directory or the index cannot be opened (kNotFound read-only, where there is
    // no store).
    static Result<std::unique_ptr<DiskTier>> open(const Options& options);
    // The process id of a server holding the store in `dir` open (RocksDB's lock on its
    // index), or 0 when none does. Another process's only: this one's opens are not seen.
    static int64_t holder(const std::string& dir);
    ~DiskTier();
    DiskTier(const DiskTier&) = delete;
    DiskTier& operator=(const DiskTier&) = delete;

    // Stores a block's bytes under `key` (replacing what it held), with `records` put in the
    // same commit. Errors: kResourceExhausted (larger than the cap), kUnavailable (not
    // admitting, or this put's I/O failed: it stops admission); nothing is stored then.
    Status put(uint64_t key, std::span<const uint8_t> bytes, std::span<const Record> records = {});
    // The block's bytes, or kNotFound (a miss). A file that is cut short or unreadable is
    // kDataLoss and dropped.
    Result<std::vector<uint8_t>> get(uint64_t key);
    // The first max_bytes of a block (all of it when shorter), for the tools: no hit, miss or
    // order is changed, and a bad file is reported (kDataLoss), not dropped.
    Result<std::vector<uint8_t>> peek(uint64_t key, uint64_t max_bytes) const;
    bool contains(uint64_t key) const;
    std::optional<uint64_t> size_of(uint64_t key) const;  // nullopt: not held
    std::vector<uint64_t> keys() const;
    // Every block, least recently written first.
    std::vector<BlockEntry> blocks() const;
    // Removes a block; `refused`: a reader found it bad (counted as dropped).
    void erase(uint64_t key, bool refused = false);

    // Small records beside the blocks (a session's token ids and turns): put atomically,
    // read back after a restart; an empty value deletes. Not counted in the cap.
    Status put_records(std::span<const Record> records);
    Result<std::optional<std::string>> get_record(const std::string& key) const;
    // Every record whose key starts with `prefix`, in key order.
    Result<std::vector<Record>> records(const std::string& prefix) const;
    // A page of them: those after prefix + `after` ("" from the first), `limit` at most.
    Result<std::vector<Record>> records(const std::string& prefix, const std::string& after,
                                        size_t limit) const;

    Stats stats() const;
    // The logged removals, oldest first (read from the index: a read-only store's too).
    Result<std::vector<Removal>> removals() const;
    // A consistent copy of the store in `out_dir` (which must not exist), for the tools while
    // the server runs: RocksDB's checkpoint of the index (hard links) and a hard link to each
    // payload file it names (a copy across file systems), taken under the tier's lock, so
    // the copy names only whole files. Errors: kAlreadyExists, kUnavailable (I/O).
    Status checkpoint(const std::string& out_dir) const;
    // RocksDB's own figures for the index, by name (rocksdb.estimate-num-keys, ...,
    // summed over its column families).
    std::vector<std::pair<std::string, uint64_t>> index_properties() const;

  private:
    struct Impl;
    explicit DiskTier(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace deltaserve::kvstore
