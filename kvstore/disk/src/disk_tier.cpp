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

namespace deltaserve::kvstore {

namespace fs = std::filesystem;

namespace {

constexpr uint8_t kEntryVersion = 1;

// Index keys are big-endian, so the index iterates in key order.
std::string index_key(uint64_t key) {
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(key >> (56 - 8 * i));
    return s;
}

uint64_t parse_index_key(const rocksdb::Slice& s) {
    uint64_t k = 0;
    for (size_t i = 0; i < 8; ++i) k = (k << 8) | static_cast<uint8_t>(s.data()[i]);
    return k;
}

struct Entry {
    uint64_t gen = 0, size = 0, seq = 0;
};

std::string encode_entry(const Entry& e) {
    std::string s(1 + 3 * 8, '\0');
    s[0] = static_cast<char>(kEntryVersion);
    std::memcpy(s.data() + 1, &e.gen, 8);
    std::memcpy(s.data() + 9, &e.size, 8);
    std::memcpy(s.data() + 17, &e.seq, 8);
    return s;
}

bool decode_entry(const rocksdb::Slice& s, Entry* e) {
    if (s.size() != 25 || static_cast<uint8_t>(s.data()[0]) != kEntryVersion) return false;
    std::memcpy(&e->gen, s.data() + 1, 8);
    std::memcpy(&e->size, s.data() + 9, 8);
    std::memcpy(&e->seq, s.data() + 17, 8);
    return true;
}

std::string file_name(uint64_t key, uint64_t gen) {
    char buf[48];
    std::snprintf(buf, sizeof(buf), "%016" PRIx64 "-%08" PRIx64 ".blk", key, gen);
    return buf;
}

bool parse_hex(std::string_view s, uint64_t* out) {
    const auto r = std::from_chars(s.data(), s.data() + s.size(), *out, 16);
    return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

bool parse_file_name(std::string_view name, uint64_t* key, uint64_t* gen) {
    if (name.size() != 16 + 1 + 8 + 4 || name.substr(25) != ".blk" || name[16] != '-') return false;
    return parse_hex(name.substr(0, 16), key) && parse_hex(name.substr(17, 8), gen);
}

std::string errno_text(const std::string& what, int err) {
    return what + ": " + std::strerror(err);
}

// Writes all of `bytes` to a new file; errno-described error text on failure (the file is
// removed).
std::string write_file(const std::string& path, std::span<const uint8_t> bytes, bool sync) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return errno_text("creating " + path, errno);
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
        return errno_text("writing " + path, err);
    }
    return {};
}

// Reads out.size() bytes from the start of fd and closes it: 0, or the errno (EIO for a file
// shorter than that).
int read_all(int fd, std::vector<uint8_t>& out) {
    size_t done = 0;
    int err = 0;
    while (done < out.size()) {
        const ssize_t n =
            ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            err = n < 0 ? errno : EIO;
            break;
        }
        done += static_cast<size_t>(n);
    }
    ::close(fd);
    return err;
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
    std::deque<std::string> removals;  // the removal records' keys, oldest first
    std::unordered_map<uint64_t, Entry> entries;
    std::map<uint64_t, uint64_t> by_seq;  // seq -> key: least recently written first
    uint64_t next_gen = 1, next_seq = 1;
    Stats stats;

    rocksdb::WriteOptions write_options() const {
        rocksdb::WriteOptions w;
        w.sync = options.sync;
        return w;
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
    void stop_admitting_locked(const std::string& why) {
        ++stats.io_errors;
        stats.admitting = false;
        stats.last_error = why;
    }

    ~Impl() {
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
        if (!fs::is_directory(options.dir + "/index", ec) ||
            !fs::is_directory(impl->payload_dir, ec))
            return not_found("disk tier: no store in " + options.dir);
    } else {
        fs::create_directories(impl->payload_dir, ec);
        if (ec)
            return unavailable("disk tier: cannot create " + impl->payload_dir + ": " +
                               ec.message());
    }

    rocksdb::DBOptions dbo;
    dbo.create_if_missing = true;
    dbo.create_missing_column_families = true;
    dbo.keep_log_file_num = 4;
    dbo.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
    const rocksdb::ColumnFamilyOptions cfo;
    const std::vector<rocksdb::ColumnFamilyDescriptor> cfs = {
        {rocksdb::kDefaultColumnFamilyName, cfo}, {"blocks", cfo}, {"records", cfo}};
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    rocksdb::DB* db = nullptr;
    const rocksdb::Status s =
        ro ? rocksdb::DB::OpenForReadOnly(dbo, options.dir + "/index", cfs, &handles, &db)
           : rocksdb::DB::Open(dbo, options.dir + "/index", cfs, &handles, &db);
    if (!s.ok()) return unavailable("disk tier: cannot open its index: " + s.ToString());
    impl->db.reset(db);
    impl->default_cf = handles[0];
    impl->blocks_cf = handles[1];
    impl->records_cf = handles[2];
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
    }
    if (!ro) {
        for (const auto& p : orphans) fs::remove(p, ec);
        impl->stats.orphans_removed = orphans.size();
    }
    // Entries whose file is gone (or was not the size the entry says) are dropped.
    for (auto it = impl->entries.begin(); it != impl->entries.end();) {
        struct stat st {};
        const bool ok = found.count(it->first) != 0 &&
                        ::stat(impl->path_of(it->first, it->second.gen).c_str(), &st) == 0 &&
                        static_cast<uint64_t>(st.st_size) == it->second.size;
        if (ok) {
            ++it;
            continue;
        }
        cleanup.Delete(impl->blocks_cf, index_key(it->first));
        impl->log_removal(cleanup, it->first, it->second, "lost");
        ++impl->stats.entries_lost;
        impl->by_seq.erase(it->second.seq);
        impl->stats.bytes -= it->second.size;
        if (!ro) fs::remove(impl->path_of(it->first, it->second.gen), ec);
        it = impl->entries.erase(it);
    }
    if (cleanup.Count() > 0 && !ro) {
        const rocksdb::Status w = db->Write(impl->write_options(), &cleanup);
        if (!w.ok()) return unavailable("disk tier: cleaning its index: " + w.ToString());
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
        if (!t.stats.admitting) {
            ++t.stats.refused;
            return unavailable("disk tier: not admitting since an I/O error (" +
                               t.stats.last_error + ")");
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
    const std::string err = write_file(path, bytes, t.options.sync);
    std::vector<std::string> unlink_after;
    {
        std::lock_guard lock(t.mu);
        if (!err.empty()) {
            t.stop_admitting_locked(err);
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
        const rocksdb::Status w = t.db->Write(t.write_options(), &batch);
        if (!w.ok()) {
            ::unlink(path.c_str());
            t.stop_admitting_locked("index write: " + w.ToString());
            return unavailable("disk tier: index write: " + w.ToString());
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
        if (!t.db->Write(t.write_options(), &batch).ok()) return;
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
    const rocksdb::Status w = t.db->Write(t.write_options(), &batch);
    if (!w.ok()) return unavailable("disk tier: writing records: " + w.ToString());
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

DiskTier::Stats DiskTier::stats() const {
    std::lock_guard lock(impl_->mu);
    Stats s = impl_->stats;
    s.blocks = impl_->entries.size();
    return s;
}

}  // namespace deltaserve::kvstore
