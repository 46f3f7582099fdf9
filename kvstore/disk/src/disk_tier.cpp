// The disk tier: payload files and a RocksDB index (disk_tier.h).
#include "deltaserve/kvstore/disk_tier.h"

#include <fcntl.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/utilities/checkpoint.h>
#include <rocksdb/write_batch.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cinttypes>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <string_view>
#include <unordered_map>

#include "disk_layout.h"
#include "store_guard.h"

// LeakSanitizer is told of the handle a poisoned tier leaves (g++ and clang say ASan apart).
#if defined(__SANITIZE_ADDRESS__)
#define DS_DISK_TIER_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DS_DISK_TIER_LSAN 1
#endif
#endif
#ifdef DS_DISK_TIER_LSAN
#include <sanitizer/lsan_interface.h>
#endif

namespace deltaserve::kvstore {

namespace fs = std::filesystem;
using namespace disk_layout;

namespace {

std::string errno_text(const std::string& what, int err) {
    return what + ": " + std::strerror(err);
}

// Writes all of `bytes` to a new file; errno-described error text on failure (the file is
// removed), the errno in *errno_out.
std::string write_file(const std::string& path, std::span<const uint8_t> bytes, bool sync,
                       int* errno_out) {
    *errno_out = 0;
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        *errno_out = errno;
        return errno_text("creating " + path, errno);
    }
    size_t done = 0;
    int err = 0;
    while (done < bytes.size()) {
        const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
        if (n < 0) {
            if (errno == EINTR) continue;
            err = errno;
            break;
        }
        done += static_cast<size_t>(n);
    }
    if (err == 0 && sync && ::fdatasync(fd) != 0) err = errno;
    if (::close(fd) != 0 && err == 0) err = errno;
    if (err != 0) {
        ::unlink(path.c_str());
        *errno_out = err;
        return errno_text("writing " + path, err);
    }
    return {};
}

// A removal's record: "ev/", the time (unix ms) and the block's key, 16 hex digits each, so
// that they sort oldest first; its value: the reason, a space and the block's bytes.
constexpr std::string_view kRemovalPrefix = "ev/";

std::string removal_key(int64_t unix_ms, uint64_t key) {
    char buf[40];
    std::snprintf(buf, sizeof(buf), "ev/%016" PRIx64 "%016" PRIx64, static_cast<uint64_t>(unix_ms),
                  key);
    return buf;
}

int64_t unix_ms_now() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

}  // namespace

struct DiskTier::Impl {
    Options options;
    std::string payload_dir;
    std::unique_ptr<rocksdb::DB> db;
    rocksdb::ColumnFamilyHandle* default_cf = nullptr;
    rocksdb::ColumnFamilyHandle* blocks_cf = nullptr;
    rocksdb::ColumnFamilyHandle* records_cf = nullptr;

    mutable std::mutex mu;
    // Every index write, under write_mu (after mu where both are taken): the free-space gate,
    // the write, the poison and the witness (store_guard.h).
    mutable std::mutex write_mu;
    bool poisoned = false;        // an index write failed: the handle is never written again
    std::string poison_reason;    // under write_mu
    bool payload_failed = false;  // a payload write failed other than for space (under mu)
    std::unique_ptr<CommitWitness> witness;
    std::vector<Mismatch> mismatches;  // what open() found
    std::deque<std::string> removals;  // the removal records' keys, oldest first
    std::unordered_map<uint64_t, Entry> entries;
    std::map<uint64_t, uint64_t> by_seq;  // seq -> key: least recently written first
    uint64_t next_gen = 1, next_seq = 1;
    Stats stats;

    // The bytes the disk must keep free for a write: a block's payload needs all of the
    // reserve besides its bytes; the index's own writes may use the reserve's last half,
    // erases (which free space) its last quarter.
    uint64_t reserve() const { return options.reserve_bytes; }
    // Why the disk cannot take `need` more bytes now, or "" when it can.
    std::string short_of_space(uint64_t need) const {
        const auto avail = free_bytes(options.dir);
        if (!avail || *avail >= need) return {};
        return "the disk is full: " + std::to_string(*avail) + " bytes free, " +
               std::to_string(need) + " needed with the reserve (--kv-disk-reserve)";
    }
    // Writes `batch` to the index, synced when `sync` (or Options::sync), if the disk has
    // `need` bytes free. A failed write poisons the handle (store_guard.h says why).
    Status commit(rocksdb::WriteBatch& batch, bool sync, uint64_t need) {
        if (options.read_only) return failed_precondition("disk tier: opened read-only");
        std::lock_guard wl(write_mu);
        if (poisoned)
            return unavailable("disk tier: its index had a write error (" + poison_reason +
                               "); nothing is written to it until the server restarts");
        if (std::string why = short_of_space(need); !why.empty())
            return resource_exhausted("disk tier: " + why);
        rocksdb::WriteOptions w;
        w.sync = sync || options.sync;
        const rocksdb::Status s = db->Write(w, &batch);
        if (!s.ok()) {
            poisoned = true;
            poison_reason = s.ToString();
            return unavailable("disk tier: index write: " + s.ToString());
        }
        if (w.sync) (void)witness->advance(db->GetLatestSequenceNumber());
        return Status();
    }
    bool is_poisoned() const {
        std::lock_guard wl(write_mu);
        return poisoned;
    }
    // Puts, or deletes for an empty value, into the records column family.
    void add_records(rocksdb::WriteBatch& batch, std::span<const Record> records) const {
        for (const auto& [k, v] : records) {
            if (v.empty()) {
                batch.Delete(records_cf, k);
            } else {
                batch.Put(records_cf, k, v);
            }
        }
    }
    std::string path_of(uint64_t key, uint64_t gen) const {
        return payload_dir + "/" + file_name(key, gen);
    }
    void forget_locked(uint64_t key) {
        auto it = entries.find(key);
        if (it == entries.end()) return;
        by_seq.erase(it->second.seq);
        stats.bytes -= it->second.size;
        entries.erase(it);
    }
    // Logs the removal of `key` (its entry `e`) in `batch`, the oldest beyond removals_kept
    // going. Under mu (or at open).
    void log_removal(rocksdb::WriteBatch& batch, uint64_t key, const Entry& e,
                     std::string_view reason) {
        const std::string k = removal_key(unix_ms_now(), key);
        batch.Put(records_cf, k, std::string(reason) + " " + std::to_string(e.size));
        removals.push_back(k);
        while (removals.size() > options.removals_kept) {
            batch.Delete(records_cf, removals.front());
            removals.pop_front();
        }
    }

    ~Impl() {
        if (db != nullptr && poisoned) {
            // Closing would sync the WAL writer that saw the error: Debian's RocksDB aborts
            // there. What was synced before stays; the handle and its memory are left.
            rocksdb::DB* leaked = db.release();
#ifdef DS_DISK_TIER_LSAN
            __lsan_ignore_object(leaked);
            for (auto* h : {blocks_cf, records_cf, default_cf}) __lsan_ignore_object(h);
#else
            (void)leaked;
#endif
            return;
        }
        if (db != nullptr) {
            for (auto* h : {blocks_cf, records_cf, default_cf}) {
                if (h != nullptr) db->DestroyColumnFamilyHandle(h);
            }
            db->Close();
        }
    }
};

DiskTier::DiskTier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DiskTier::~DiskTier() = default;

Result<std::unique_ptr<DiskTier>> DiskTier::open(const Options& options) {
    const auto start = std::chrono::steady_clock::now();
    auto impl = std::make_unique<Impl>();
    impl->options = options;
    impl->payload_dir = options.dir + "/payload";
    const bool ro = options.read_only;
    std::error_code ec;
    if (ro) {
        if (!fs::is_directory(options.dir + "/index", ec) &&
            !fs::is_directory(impl->payload_dir, ec))
            return not_found("disk tier: no store in " + options.dir);
    } else {
        fs::create_directories(impl->payload_dir, ec);
        if (ec)
            return unavailable("disk tier: cannot create " + impl->payload_dir + ": " +
                               ec.message());
    }

    // A store whose index is gone while its commit record or its blocks are there lost its
    // index: never opened as a new, empty store (that would drop every session silently).
    impl->witness = std::make_unique<CommitWitness>(options.dir);
    const Result<uint64_t> witnessed = impl->witness->read();
    if (!witnessed.ok()) return data_loss("disk tier: " + witnessed.status().message());
    const uint64_t acknowledged = *witnessed;
    const std::string index_dir = options.dir + "/index";
    if (!fs::exists(index_dir + "/CURRENT", ec)) {
        size_t blocks = 0;
        for (const auto& f : fs::directory_iterator(impl->payload_dir, ec)) {
            uint64_t key = 0, gen = 0;
            blocks += parse_file_name(f.path().filename().string(), &key, &gen);
        }
        if (acknowledged > 0 || blocks > 0) {
            return data_loss("disk tier: the index " + index_dir + " is missing, but " +
                             std::to_string(blocks) + " block files are in " + impl->payload_dir +
                             (acknowledged > 0 ? " and " + impl->witness->path() + " names " +
                                                     std::to_string(acknowledged) + " index writes"
                                               : std::string()));
        }
        if (ro) return not_found("disk tier: no store in " + options.dir);
    }

    const rocksdb::DBOptions dbo = db_options();
    const std::vector<rocksdb::ColumnFamilyDescriptor> cfs = column_families();
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    rocksdb::DB* db = nullptr;
    const rocksdb::Status s = ro ? rocksdb::DB::OpenForReadOnly(dbo, index_dir, cfs, &handles, &db)
                                 : rocksdb::DB::Open(dbo, index_dir, cfs, &handles, &db);
    if (s.IsCorruption())
        return data_loss("disk tier: the index " + index_dir + " is damaged: " + s.ToString());
    if (!s.ok()) return unavailable("disk tier: cannot open its index: " + s.ToString());
    impl->db.reset(db);
    impl->default_cf = handles[0];
    impl->blocks_cf = handles[1];
    impl->records_cf = handles[2];
    if (const uint64_t seq = db->GetLatestSequenceNumber(); seq < acknowledged) {
        return data_loss(
            "disk tier: the index " + index_dir + " lost acknowledged writes: it ends at write " +
            std::to_string(seq) + ", but " + impl->witness->path() + " names " +
            std::to_string(acknowledged) + " (its write-ahead log was cut short or replaced)");
    }
    {
        std::unique_ptr<rocksdb::Iterator> it(
            db->NewIterator(rocksdb::ReadOptions(), impl->records_cf));
        for (it->Seek(kRemovalPrefix); it->Valid() && it->key().starts_with(kRemovalPrefix);
             it->Next())
            impl->removals.push_back(it->key().ToString());
    }

    // The index, then the payload files it does not name.
    rocksdb::WriteBatch cleanup;
    {
        std::unique_ptr<rocksdb::Iterator> it(
            db->NewIterator(rocksdb::ReadOptions(), impl->blocks_cf));
        for (it->SeekToFirst(); it->Valid(); it->Next()) {
            Entry e;
            if (it->key().size() != 8 || !decode_entry(it->value(), &e)) {
                cleanup.Delete(impl->blocks_cf, it->key());
                ++impl->stats.entries_lost;
                impl->mismatches.push_back({"entry",
                                            it->key().size() == 8 ? parse_index_key(it->key()) : 0,
                                            "", "an index entry that does not parse"});
                continue;
            }
            const uint64_t key = parse_index_key(it->key());
            impl->entries[key] = e;
            impl->by_seq[e.seq] = key;
            impl->stats.bytes += e.size;
            impl->next_gen = std::max(impl->next_gen, e.gen + 1);
            impl->next_seq = std::max(impl->next_seq, e.seq + 1);
        }
        if (!it->status().ok())
            return unavailable("disk tier: reading its index: " + it->status().ToString());
    }
    std::unordered_map<uint64_t, uint64_t> found;  // key -> gen of a file the index names
    std::vector<fs::path> orphans;
    for (const auto& f : fs::directory_iterator(impl->payload_dir, ec)) {
        uint64_t key = 0, gen = 0;
        if (parse_file_name(f.path().filename().string(), &key, &gen)) {
            impl->next_gen = std::max(impl->next_gen, gen + 1);
            const auto e = impl->entries.find(key);
            if (e != impl->entries.end() && e->second.gen == gen) {
                found[key] = gen;
                continue;
            }
        }
        orphans.push_back(f.path());
        impl->mismatches.push_back(
            {"orphan", key, f.path().filename().string(), "a payload file no index entry names"});
    }
    if (!ro) {
        for (const auto& p : orphans) fs::remove(p, ec);
        impl->stats.orphans_removed = orphans.size();
    }
    // Entries whose file is gone (or was not the size the entry says) are dropped.
    for (auto it = impl->entries.begin(); it != impl->entries.end();) {
        struct stat st {};
        const std::string path = impl->path_of(it->first, it->second.gen);
        const bool present = found.count(it->first) != 0 && ::stat(path.c_str(), &st) == 0;
        if (present && static_cast<uint64_t>(st.st_size) == it->second.size) {
            ++it;
            continue;
        }
        impl->mismatches.push_back(
            {present ? "size" : "missing", it->first, file_name(it->first, it->second.gen),
             present ? "its payload file has " + std::to_string(st.st_size) +
                           " bytes, the index says " + std::to_string(it->second.size)
                     : "its payload file is gone"});
        cleanup.Delete(impl->blocks_cf, index_key(it->first));
        impl->log_removal(cleanup, it->first, it->second, "lost");
        ++impl->stats.entries_lost;
        impl->by_seq.erase(it->second.seq);
        impl->stats.bytes -= it->second.size;
        if (!ro) fs::remove(impl->path_of(it->first, it->second.gen), ec);
        it = impl->entries.erase(it);
    }
    if (!ro) {
        if (cleanup.Count() > 0) {
            const Status w = impl->commit(cleanup, /*sync=*/true, impl->reserve() / 4);
            if (!w.ok()) return w.with_context("disk tier: cleaning its index");
        }
        // The witness names at least what the store holds now (a store made before
        // witnesses gets one here).
        DS_RETURN_IF_ERROR(
            impl->witness->advance(db->GetLatestSequenceNumber()).with_context("disk tier"));
    }
    impl->stats.capacity = options.capacity_bytes;
    impl->stats.blocks = impl->entries.size();
    if (ro) {
        impl->stats.admitting = false;
        impl->stats.last_error = "opened read-only";
    }
    impl->stats.recovery_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    return std::unique_ptr<DiskTier>(new DiskTier(std::move(impl)));
}

Status DiskTier::put(uint64_t key, std::span<const uint8_t> bytes,
                     std::span<const Record> records) {
    Impl& t = *impl_;
    uint64_t gen = 0;
    {
        std::lock_guard lock(t.mu);
        if (t.payload_failed || t.is_poisoned()) {
            ++t.stats.refused;
            return unavailable("disk tier: not admitting since an I/O error (" +
                               t.stats.last_error + ")");
        }
        // Below the reserve nothing is admitted; admission comes back with the space.
        if (std::string why = t.short_of_space(t.reserve() + bytes.size()); !why.empty()) {
            ++t.stats.refused;
            return resource_exhausted("disk tier: " + why);
        }
        if (bytes.size() > t.options.capacity_bytes) {
            ++t.stats.refused;
            return resource_exhausted("disk tier: a block of " + std::to_string(bytes.size()) +
                                      " bytes is larger than its cap of " +
                                      std::to_string(t.options.capacity_bytes));
        }
        gen = t.next_gen++;
    }
    const std::string path = t.path_of(key, gen);
    int write_errno = 0;
    const std::string err = write_file(path, bytes, t.options.sync, &write_errno);
    std::vector<std::string> unlink_after;
    {
        std::lock_guard lock(t.mu);
        if (!err.empty()) {
            // Out of space (the gate raced another writer): admission comes back with the
            // space. Anything else (EIO, EROFS) stops it until a restart.
            ++t.stats.io_errors;
            t.stats.last_error = err;
            if (write_errno != ENOSPC && write_errno != EDQUOT) t.payload_failed = true;
            return unavailable("disk tier: " + err);
        }
        // Room: the least recently written blocks other than this key's.
        const auto old = t.entries.find(key);
        uint64_t held = t.stats.bytes - (old != t.entries.end() ? old->second.size : 0);
        std::vector<uint64_t> victims;
        for (auto it = t.by_seq.begin();
             it != t.by_seq.end() && held + bytes.size() > t.options.capacity_bytes; ++it) {
            if (it->second == key) continue;
            victims.push_back(it->second);
            held -= t.entries.at(it->second).size;
        }
        rocksdb::WriteBatch batch;
        for (uint64_t v : victims) {
            batch.Delete(t.blocks_cf, index_key(v));
            t.log_removal(batch, v, t.entries.at(v), "cap");
        }
        const Entry e{gen, bytes.size(), t.next_seq++};
        batch.Put(t.blocks_cf, index_key(key), encode_entry(e));
        t.add_records(batch, records);
        // Records (a session's) are acknowledged to clients: synced.
        const Status w = t.commit(batch, !records.empty(), t.reserve() / 2);
        if (!w.ok()) {
            ::unlink(path.c_str());
            // Not logged after all.
            t.removals.resize(t.removals.size() - std::min(t.removals.size(), victims.size()));
            if (w.code() != StatusCode::kResourceExhausted) {
                ++t.stats.io_errors;
                t.stats.last_error = w.message();
            }
            return w;
        }
        for (uint64_t v : victims) {
            unlink_after.push_back(t.path_of(v, t.entries.at(v).gen));
            t.forget_locked(v);
        }
        if (old != t.entries.end()) {
            unlink_after.push_back(t.path_of(key, old->second.gen));
            t.forget_locked(key);
        }
        t.entries[key] = e;
        t.by_seq[e.seq] = key;
        t.stats.bytes += e.size;
        t.stats.evictions += victims.size();
        ++t.stats.stores;
    }
    for (const std::string& p : unlink_after) ::unlink(p.c_str());
    return Status();
}

Result<std::vector<uint8_t>> DiskTier::get(uint64_t key) {
    Impl& t = *impl_;
    Entry e;
    {
        std::lock_guard lock(t.mu);
        auto it = t.entries.find(key);
        if (it == t.entries.end()) {
            ++t.stats.misses;
            return not_found("disk tier: no block " + std::to_string(key));
        }
        // Read: most recent again (in memory; a restart goes back to write order).
        t.by_seq.erase(it->second.seq);
        it->second.seq = t.next_seq++;
        t.by_seq[it->second.seq] = key;
        e = it->second;
    }
    const std::string path = t.path_of(key, e.gen);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        const int err = errno;
        std::lock_guard lock(t.mu);
        auto it = t.entries.find(key);
        if (err == ENOENT && (it == t.entries.end() || it->second.gen != e.gen)) {
            ++t.stats.misses;  // evicted or replaced while this read began
            return not_found("disk tier: block " + std::to_string(key) + " went away");
        }
        return data_loss("disk tier: " + errno_text("opening " + path, err));
    }
    std::vector<uint8_t> out(e.size);
    const int err = read_all(fd, out);
    if (err != 0) {
        erase(key, true);  // (nothing, read-only)
        return data_loss("disk tier: " + errno_text("reading " + path, err));
    }
    std::lock_guard lock(t.mu);
    ++t.stats.hits;
    return out;
}

Result<std::vector<uint8_t>> DiskTier::peek(uint64_t key, uint64_t max_bytes) const {
    const Impl& t = *impl_;
    Entry e;
    {
        std::lock_guard lock(t.mu);
        auto it = t.entries.find(key);
        if (it == t.entries.end()) return not_found("disk tier: no block " + std::to_string(key));
        e = it->second;
    }
    const std::string path = t.path_of(key, e.gen);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return data_loss("disk tier: " + errno_text("opening " + path, errno));
    std::vector<uint8_t> out(std::min(e.size, max_bytes));
    const int err = read_all(fd, out);
    if (err != 0) return data_loss("disk tier: " + errno_text("reading " + path, err));
    return out;
}

int64_t DiskTier::holder(const std::string& dir) {
    // RocksDB locks its LOCK file with fcntl (PosixEnv::LockFile): another process's lock
    // shows with F_GETLK.
    const std::string path = dir + "/index/LOCK";
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    struct flock f {};
    f.l_type = F_WRLCK;
    f.l_whence = SEEK_SET;
    const bool got = ::fcntl(fd, F_GETLK, &f) == 0;
    ::close(fd);
    return got && f.l_type != F_UNLCK ? std::max<int64_t>(1, f.l_pid) : 0;
}

std::vector<DiskTier::BlockEntry> DiskTier::blocks() const {
    std::vector<BlockEntry> out;
    std::vector<std::string> paths;
    {
        std::lock_guard lock(impl_->mu);
        for (const auto& [seq, key] : impl_->by_seq) {
            const Entry& e = impl_->entries.at(key);
            out.push_back({key, e.size, seq, 0});
            paths.push_back(impl_->path_of(key, e.gen));
        }
    }
    for (size_t i = 0; i < out.size(); ++i) {
        struct stat st {};
        if (::stat(paths[i].c_str(), &st) == 0) out[i].mtime_s = st.st_mtime;
    }
    return out;
}

Status DiskTier::checkpoint(const std::string& out_dir) const {
    std::error_code ec;
    if (fs::exists(out_dir, ec))
        return Status(StatusCode::kAlreadyExists, "disk tier: " + out_dir + " exists already");
    fs::create_directories(out_dir + "/payload", ec);
    if (ec) return unavailable("disk tier: cannot create " + out_dir + ": " + ec.message());
    // Under the lock: every entry's file exists (written before its commit, unlinked only
    // after its entry went), and the index holds exactly the entries.
    std::lock_guard lock(impl_->mu);
    rocksdb::Checkpoint* raw = nullptr;
    rocksdb::Status s = rocksdb::Checkpoint::Create(impl_->db.get(), &raw);
    std::unique_ptr<rocksdb::Checkpoint> cp(raw);
    if (s.ok()) s = cp->CreateCheckpoint(out_dir + "/index");
    if (!s.ok()) return unavailable("disk tier: checkpoint of the index: " + s.ToString());
    for (const auto& [key, e] : impl_->entries) {
        const std::string name = file_name(key, e.gen);
        const fs::path from = impl_->payload_dir + "/" + name, to = out_dir + "/payload/" + name;
        fs::create_hard_link(from, to, ec);
        if (ec == std::errc::cross_device_link) {
            ec.clear();
            fs::copy_file(from, to, ec);
        }
        if (ec) return unavailable("disk tier: checkpoint of " + name + ": " + ec.message());
    }
    return Status();
}

std::vector<std::pair<std::string, uint64_t>> DiskTier::index_properties() const {
    std::vector<std::pair<std::string, uint64_t>> out;
    for (const char* name : {"rocksdb.estimate-num-keys", "rocksdb.total-sst-files-size",
                             "rocksdb.live-sst-files-size", "rocksdb.estimate-live-data-size",
                             "rocksdb.cur-size-all-mem-tables", "rocksdb.num-live-versions",
                             "rocksdb.estimate-pending-compaction-bytes",
                             "rocksdb.num-running-compactions", "rocksdb.background-errors"}) {
        uint64_t sum = 0;
        for (auto* cf : {impl_->default_cf, impl_->blocks_cf, impl_->records_cf}) {
            uint64_t v = 0;
            if (impl_->db->GetIntProperty(cf, name, &v)) sum += v;
        }
        out.emplace_back(name, sum);
    }
    return out;
}

std::optional<uint64_t> DiskTier::size_of(uint64_t key) const {
    std::lock_guard lock(impl_->mu);
    auto it = impl_->entries.find(key);
    if (it == impl_->entries.end()) return std::nullopt;
    return it->second.size;
}

bool DiskTier::contains(uint64_t key) const {
    std::lock_guard lock(impl_->mu);
    return impl_->entries.count(key) != 0;
}

std::vector<uint64_t> DiskTier::keys() const {
    std::lock_guard lock(impl_->mu);
    std::vector<uint64_t> out;
    out.reserve(impl_->entries.size());
    for (const auto& [k, e] : impl_->entries) out.push_back(k);
    return out;
}

void DiskTier::erase(uint64_t key, bool refused) {
    Impl& t = *impl_;
    if (t.options.read_only) return;
    std::string path;
    {
        std::lock_guard lock(t.mu);
        auto it = t.entries.find(key);
        if (it == t.entries.end()) return;
        // Index first: a crash after it leaves an orphan file, which open() removes.
        rocksdb::WriteBatch batch;
        batch.Delete(t.blocks_cf, index_key(key));
        t.log_removal(batch, key, it->second, refused ? "refused" : "erased");
        // (Not written: the log's keys in memory may name one that is not stored, whose
        // later delete does nothing.)
        if (!t.commit(batch, false, t.reserve() / 4).ok()) return;
        path = t.path_of(key, it->second.gen);
        t.forget_locked(key);
        t.stats.dropped += refused;
    }
    ::unlink(path.c_str());
}

Status DiskTier::put_records(std::span<const Record> records) {
    Impl& t = *impl_;
    if (t.options.read_only) return failed_precondition("disk tier: opened read-only");
    rocksdb::WriteBatch batch;
    t.add_records(batch, records);
    uint64_t bytes = 0;
    bool deletes_only = true;
    for (const auto& [k, v] : records) {
        bytes += k.size() + v.size();
        deletes_only = deletes_only && v.empty();
    }
    // Synced: a session's record is what a client was told is stored. Deletes (which free
    // space) may use the reserve down to its last quarter, as erases do: a session closed on
    // a full disk must not come back after a restart.
    const uint64_t need = deletes_only ? t.reserve() / 4 : t.reserve() / 2 + bytes;
    const Status w = t.commit(batch, /*sync=*/true, need);
    if (!w.ok()) {
        if (w.code() != StatusCode::kResourceExhausted) {
            std::lock_guard lock(t.mu);
            ++t.stats.io_errors;
            t.stats.last_error = w.message();
        }
        return w.with_context("writing records");
    }
    return Status();
}

Result<std::optional<std::string>> DiskTier::get_record(const std::string& key) const {
    std::string value;
    const rocksdb::Status s =
        impl_->db->Get(rocksdb::ReadOptions(), impl_->records_cf, key, &value);
    if (s.IsNotFound()) return std::optional<std::string>();
    if (!s.ok()) return unavailable("disk tier: reading a record: " + s.ToString());
    return std::optional<std::string>(std::move(value));
}

Result<std::vector<DiskTier::Record>> DiskTier::records(const std::string& prefix) const {
    return records(prefix, "", SIZE_MAX);
}

Result<std::vector<DiskTier::Record>> DiskTier::records(const std::string& prefix,
                                                        const std::string& after,
                                                        size_t limit) const {
    std::vector<Record> out;
    std::unique_ptr<rocksdb::Iterator> it(
        impl_->db->NewIterator(rocksdb::ReadOptions(), impl_->records_cf));
    const std::string from = prefix + after;
    it->Seek(from);
    if (!after.empty() && it->Valid() && it->key() == from) it->Next();
    for (; it->Valid() && it->key().starts_with(prefix) && out.size() < limit; it->Next())
        out.emplace_back(it->key().ToString(), it->value().ToString());
    if (!it->status().ok())
        return unavailable("disk tier: reading records: " + it->status().ToString());
    return out;
}

Result<std::vector<DiskTier::Removal>> DiskTier::removals() const {
    DS_ASSIGN_OR_RETURN(auto records, records(std::string(kRemovalPrefix)));
    std::vector<Removal> out;
    for (const auto& [k, v] : records) {
        Removal r;
        uint64_t ms = 0, size = 0;
        // Anything that is not one of ours is skipped, as any stored bytes that do not parse.
        const size_t space = v.find(' ');
        if (space == 0 || space == std::string::npos) continue;
        const std::string_view body = std::string_view(k).substr(kRemovalPrefix.size());
        const char* end = v.data() + v.size();
        const auto bytes = std::from_chars(v.data() + space + 1, end, size);
        if (body.size() != 32 || !parse_hex(body.substr(0, 16), &ms) ||
            !parse_hex(body.substr(16), &r.key) || bytes.ec != std::errc() || bytes.ptr != end)
            continue;
        r.unix_ms = static_cast<int64_t>(ms);
        r.bytes = size;
        r.reason = v.substr(0, space);
        out.push_back(std::move(r));
    }
    return out;
}

std::vector<DiskTier::Mismatch> DiskTier::mismatches() const { return impl_->mismatches; }

DiskTier::Stats DiskTier::stats() const {
    const Impl& t = *impl_;
    std::lock_guard lock(t.mu);
    Stats s = t.stats;
    s.blocks = t.entries.size();
    if (t.options.read_only) return s;
    {
        std::lock_guard wl(t.write_mu);
        s.records_writable = !t.poisoned;
        if (t.poisoned) s.last_error = "index write: " + t.poison_reason;
    }
    s.out_of_space = !t.short_of_space(t.reserve()).empty();
    s.admitting = s.records_writable && !t.payload_failed && !s.out_of_space;
    return s;
}

}  // namespace deltaserve::kvstore
