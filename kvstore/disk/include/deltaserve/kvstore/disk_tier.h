// The disk tier of the tiered KV store (issue 36): stored KV blocks (kv_block.h bytes) on
// local disk under a byte cap, kept across restarts. Each block's bytes are one file under
// DIR/payload; the index (block key -> file generation, size, write order) and small records
// (the gateway's session records) live in RocksDB under DIR/index. A put writes the payload
// file first and then commits the index entry, the evictions it makes room with and any
// records given with it in one atomic WriteBatch, so after a crash (kill -9) the index names
// only whole files; open() recovers from the index alone and removes payload files no entry
// names (a put cut short). Disk faults (src/store_guard.h): below a reserve of free space
// (Options::reserve_bytes) the tier admits no block, and the index is written only into the
// reserve, so RocksDB never meets a full disk (Debian's RocksDB aborts on a log writer that
// saw an error); admission comes back with the space. A payload write that fails for another
// reason (EIO, EROFS) stops admission; an index write that fails anyway poisons the index
// handle: nothing is written to it again (records fail, reads go on) until a restart.
// Records are written synced. A damaged store is never opened silently: a log or MANIFEST
// that does not verify, an index gone while blocks or its commit record (DIR/COMMITTED,
// the last synced write) are there, or an index behind that record fail open() with
// kDataLoss naming what is wrong; a record torn at the log's very end (a crash) is taken.
// Least recently written blocks go first when
// room is needed (reads reorder them until a restart). Each block removed (by the cap, as
// bad, by its owner, or found lost at open) is logged with the time and why, in the commit
// that removes it: the last Options::removals_kept, as records under "ev/" (removals()).
// Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
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
        // Free space kept on the disk: a block is admitted only while this much stays free
        // besides it; the index's own writes (records, removals) may use the reserve's last
        // half. Default 64 MiB.
        uint64_t reserve_bytes = uint64_t{64} << 20;
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
        bool admitting = true;         // a block put now would be tried
        bool out_of_space = false;     // below the reserve (admission resumes with the space)
        bool records_writable = true;  // false: an index write failed (until a restart)
        std::string last_error;        // the last I/O error
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
    // no store), kDataLoss for a damaged store (nothing is changed then).
    static Result<std::unique_ptr<DiskTier>> open(const Options& options);
    // What repair() did and found.
    struct RepairReport {
        // Whether the old index opened clean with every write its commit record names; when
        // not, why (its records were salvaged as far as RocksDB's repair reads them, and may
        // be older than what clients were told).
        bool index_trusted = true;
        std::string index_problem;
        std::string old_index;  // where the old index was moved ("" where there was none)
        uint64_t blocks = 0, block_bytes = 0;  // payload files indexed again
        uint64_t quarantined = 0;              // moved to DIR/quarantine (bad, or superseded)
        uint64_t records = 0;                  // records carried over
        uint64_t records_changed = 0;          // ... that fix_record changed or dropped
        std::vector<std::string> notes;        // one line per finding
    };
    // A block file's check for repair(): "" when its bytes are a whole, valid block stored
    // under `key`, else why not.
    using BlockCheck = std::function<std::string(uint64_t key, std::span<const uint8_t> bytes)>;
    // A record carried over by repair(): the value to write ("" drops it); `trusted` is
    // RepairReport::index_trusted (a caller marks what it can no longer vouch for).
    using RecordFix =
        std::function<std::string(const std::string& key, const std::string& value, bool trusted)>;
    // Rebuilds the index of the stopped store in `dir` (deltactl repair): the old index is
    // moved aside (DIR/index.before-repair-<unix time>, kept), its records are read as far as
    // they can be (RocksDB's RepairDB on a copy when it does not open clean), every payload
    // file that `check` passes is indexed again (the newest of a key's), the rest are moved
    // to DIR/quarantine, the records are written through `fix`, and the commit record is
    // written anew. Nothing is deleted. Errors: kFailedPrecondition (a process holds the
    // store), kNotFound (no store in dir), kUnavailable (I/O).
    static Result<RepairReport> repair(const std::string& dir, const BlockCheck& check,
                                       const RecordFix& fix);

    // The process id of a server holding the store in `dir` open (RocksDB's lock on its
    // index), or 0 when none does. Another process's only: this one's opens are not seen.
    static int64_t holder(const std::string& dir);
    ~DiskTier();
    DiskTier(const DiskTier&) = delete;
    DiskTier& operator=(const DiskTier&) = delete;

    // Stores a block's bytes under `key` (replacing what it held), with `records` put in the
    // same commit (synced when there are records). Errors: kResourceExhausted (larger than
    // the cap, or the disk below its reserve), kUnavailable (not admitting since an I/O
    // error, or this put's I/O failed); nothing is stored then.
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

    // Small records beside the blocks (a session's token ids and turns): put atomically and
    // synced (durable when it returns OK), read back after a restart; an empty value deletes.
    // Not counted in the cap. Errors: kResourceExhausted (the disk is full to the reserve's
    // last half), kUnavailable (the index handle is poisoned, or this write failed).
    Status put_records(std::span<const Record> records);
    Result<std::optional<std::string>> get_record(const std::string& key) const;
    // Every record whose key starts with `prefix`, in key order.
    Result<std::vector<Record>> records(const std::string& prefix) const;
    // A page of them: those after prefix + `after` ("" from the first), `limit` at most.
    Result<std::vector<Record>> records(const std::string& prefix, const std::string& after,
                                        size_t limit) const;

    Stats stats() const;
    // What open() found that the index and the payload files disagree on: kind "orphan" (a
    // file no entry names: a put cut short), "missing" (an entry whose file is gone),
    // "size" (whose file has another size) or "entry" (an entry that does not parse). A
    // writable open mends them (removes the file or the entry; Stats counts them), a
    // read-only one only reports them (deltactl verify).
    struct Mismatch {
        std::string kind;
        uint64_t key = 0;
        std::string file, detail;
    };
    std::vector<Mismatch> mismatches() const;
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
