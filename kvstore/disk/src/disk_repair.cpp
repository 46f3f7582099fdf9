// The disk tier's repair (DiskTier::repair, disk_tier.h): a new index from the payload files
// and what the old index still yields.
#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>
#include <sys/stat.h>

#include <fcntl.h>
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <tuple>

#include "deltaserve/kvstore/disk_tier.h"
#include "disk_layout.h"
#include "store_guard.h"

namespace deltaserve::kvstore {

namespace fs = std::filesystem;
using namespace disk_layout;

namespace {

// An open index and its column family handles, closed on destruction.
struct OpenIndex {
    std::unique_ptr<rocksdb::DB> db;
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    ~OpenIndex() {
        if (db == nullptr) return;
        for (auto* h : handles) db->DestroyColumnFamilyHandle(h);
        db->Close();
    }
};

Status open_index(const std::string& dir, const rocksdb::DBOptions& options, bool read_only,
                  OpenIndex* out) {
    rocksdb::DB* db = nullptr;
    const rocksdb::Status s =
        read_only
            ? rocksdb::DB::OpenForReadOnly(options, dir, column_families(), &out->handles, &db)
            : rocksdb::DB::Open(options, dir, column_families(), &out->handles, &db);
    if (!s.ok()) return unavailable(s.ToString());
    out->db.reset(db);
    return Status();
}

// Every record of an open index (its "records" column family), in key order.
Status read_records(OpenIndex& index, std::vector<DiskTier::Record>* out) {
    rocksdb::ReadOptions ro;
    std::unique_ptr<rocksdb::Iterator> it(index.db->NewIterator(ro, index.handles[2]));
    for (it->SeekToFirst(); it->Valid(); it->Next())
        out->emplace_back(it->key().ToString(), it->value().ToString());
    return it->status().ok() ? Status() : unavailable(it->status().ToString());
}

// The old index's records: read from it when it opens clean (and then whether it holds
// every write its commit record names), else salvaged from a copy by RocksDB's RepairDB.
void salvage_records(const std::string& dir, DiskTier::RepairReport* report,
                     std::vector<DiskTier::Record>* records) {
    const std::string index_dir = dir + "/index";
    std::error_code ec;
    if (!fs::exists(index_dir + "/CURRENT", ec)) {
        report->index_trusted = false;
        report->index_problem = "the index " + index_dir + " is missing";
        return;
    }
    CommitWitness witness(dir);
    const Result<uint64_t> acknowledged = witness.read();
    {
        OpenIndex index;
        Status st = open_index(index_dir, db_options(), /*read_only=*/true, &index);
        if (st.ok()) {
            const uint64_t seq = index.db->GetLatestSequenceNumber();
            if (!acknowledged.ok()) {
                report->index_trusted = false;
                report->index_problem = acknowledged.status().message();
            } else if (seq < *acknowledged) {
                report->index_trusted = false;
                report->index_problem = "the index lost acknowledged writes (it ends at write " +
                                        std::to_string(seq) + ", the commit record names " +
                                        std::to_string(*acknowledged) + ")";
            }
            st = read_records(index, records);
            if (st.ok()) return;
        }
        report->index_trusted = false;
        report->index_problem = "the index does not open clean: " + st.message();
        records->clear();
    }
    // The records past the damage, where RocksDB can read them: the old index opened again
    // skipping the log records that do not verify (its MANIFEST whole), else a copy rebuilt
    // by RocksDB's RepairDB (a damaged MANIFEST).
    rocksdb::DBOptions options = db_options();
    options.wal_recovery_mode = rocksdb::WALRecoveryMode::kSkipAnyCorruptedRecords;
    options.paranoid_checks = false;
    {
        OpenIndex index;
        Status st = open_index(index_dir, options, /*read_only=*/true, &index);
        if (st.ok()) st = read_records(index, records);
        if (st.ok()) return;
        records->clear();
        report->notes.push_back("the old index does not open skipping its damaged records: " +
                                st.message());
    }
    const std::string copy = dir + "/index.salvage";
    fs::remove_all(copy, ec);
    fs::copy(index_dir, copy, fs::copy_options::recursive, ec);
    if (ec) {
        report->notes.push_back("the old index could not be copied for salvage: " + ec.message());
        return;
    }
    const rocksdb::Status repaired = rocksdb::RepairDB(copy, options, column_families());
    if (!repaired.ok())
        report->notes.push_back("RocksDB's repair of the old index: " + repaired.ToString());
    {
        OpenIndex index;
        Status st = open_index(copy, options, /*read_only=*/true, &index);
        if (st.ok()) st = read_records(index, records);
        if (!st.ok())
            report->notes.push_back("no record could be read from the old index: " + st.message());
    }
    fs::remove_all(copy, ec);
}

Status write_batch(rocksdb::DB& db, rocksdb::WriteBatch& batch) {
    rocksdb::WriteOptions w;
    w.sync = true;
    const rocksdb::Status s = db.Write(w, &batch);
    batch.Clear();
    return s.ok() ? Status() : unavailable("writing the new index: " + s.ToString());
}

}  // namespace

Result<DiskTier::RepairReport> DiskTier::repair(const std::string& dir, const BlockCheck& check,
                                                const RecordFix& fix) {
    const std::string index_dir = dir + "/index", payload_dir = dir + "/payload";
    std::error_code ec;
    if (!fs::is_directory(payload_dir, ec)) return not_found("no store in " + dir);
    if (const int64_t pid = holder(dir))
        return failed_precondition("the store in " + dir + " is open in a running process (pid " +
                                   std::to_string(pid) + "): stop it first");
    RepairReport report;
    std::vector<Record> records;
    salvage_records(dir, &report, &records);
    if (!report.index_trusted) report.notes.push_back(report.index_problem);

    // The payload files: each key's newest that passes the check is indexed, in the order
    // the files were written; the rest go to quarantine.
    struct File {
        uint64_t key = 0, gen = 0, size = 0;
        int64_t mtime_ns = 0;
        std::string name;
    };
    std::map<uint64_t, File> keep;
    std::vector<std::pair<std::string, std::string>> quarantine;  // name, why
    for (const auto& f : fs::directory_iterator(payload_dir, ec)) {
        File file;
        file.name = f.path().filename().string();
        if (!parse_file_name(file.name, &file.key, &file.gen)) {
            quarantine.emplace_back(file.name, "not a block file's name");
            continue;
        }
        std::vector<uint8_t> bytes;
        struct stat st {};
        const int fd = ::open(f.path().c_str(), O_RDONLY | O_CLOEXEC);
        std::string why;
        if (fd < 0 || ::fstat(fd, &st) != 0) {
            why = "unreadable";
            if (fd >= 0) ::close(fd);
        } else {
            bytes.resize(static_cast<size_t>(st.st_size));
            if (read_all(fd, bytes) != 0) why = "unreadable";  // (closes fd)
        }
        if (why.empty()) why = check(file.key, bytes);
        if (!why.empty()) {
            quarantine.emplace_back(file.name, why);
            continue;
        }
        file.size = bytes.size();
        file.mtime_ns =
            static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
        auto [it, fresh] = keep.try_emplace(file.key, file);
        if (!fresh) {
            File older = file;
            if (file.gen > it->second.gen) std::swap(older, it->second);
            quarantine.emplace_back(older.name, "superseded by a newer file of its key");
        }
    }
    if (ec) return unavailable("reading " + payload_dir + ": " + ec.message());

    // The old index aside, kept; then the new one.
    if (fs::exists(index_dir, ec)) {
        const auto now = std::chrono::system_clock::now().time_since_epoch();
        report.old_index =
            index_dir + ".before-repair-" +
            std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now).count());
        fs::rename(index_dir, report.old_index, ec);
        if (ec) return unavailable("moving the old index aside: " + ec.message());
    }
    if (!quarantine.empty()) {
        fs::create_directories(dir + "/quarantine", ec);
        for (const auto& [name, why] : quarantine) {
            fs::rename(payload_dir + "/" + name, dir + "/quarantine/" + name, ec);
            if (ec) return unavailable("moving " + name + " to quarantine: " + ec.message());
            report.notes.push_back("quarantined " + name + ": " + why);
        }
        report.quarantined = quarantine.size();
    }
    OpenIndex index;
    DS_RETURN_IF_ERROR(open_index(index_dir, db_options(), /*read_only=*/false, &index)
                           .with_context("creating the new index"));
    std::vector<File> files;
    for (const auto& [key, f] : keep) files.push_back(f);
    std::sort(files.begin(), files.end(), [](const File& a, const File& b) {
        return std::tie(a.mtime_ns, a.gen) < std::tie(b.mtime_ns, b.gen);
    });
    rocksdb::WriteBatch batch;
    uint64_t seq = 0;
    for (const File& f : files) {
        batch.Put(index.handles[1], index_key(f.key), encode_entry({f.gen, f.size, ++seq}));
        report.block_bytes += f.size;
        if (batch.Count() >= 1000) DS_RETURN_IF_ERROR(write_batch(*index.db, batch));
    }
    report.blocks = files.size();
    for (const auto& [k, v] : records) {
        const std::string value = fix(k, v, report.index_trusted);
        report.records_changed += value != v;
        if (value.empty()) continue;
        batch.Put(index.handles[2], k, value);
        ++report.records;
        if (batch.Count() >= 1000) DS_RETURN_IF_ERROR(write_batch(*index.db, batch));
    }
    DS_RETURN_IF_ERROR(write_batch(*index.db, batch));
    CommitWitness witness(dir);
    DS_RETURN_IF_ERROR(witness.advance(index.db->GetLatestSequenceNumber()));
    return report;
}

}  // namespace deltaserve::kvstore
