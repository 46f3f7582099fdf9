// The disk tier's layout on disk (disk_layout.h).
#include "disk_layout.h"

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cinttypes>
#include <cstdio>
#include <cstring>

namespace deltaserve::kvstore::disk_layout {

namespace {
constexpr uint8_t kEntryVersion = 1;

}  // namespace

std::vector<rocksdb::ColumnFamilyDescriptor> column_families() {
    rocksdb::ColumnFamilyOptions cfo;
    // Small memtables: a flush then needs a few MiB of disk, which the reserve keeps.
    cfo.write_buffer_size = 4u << 20;
    return {{rocksdb::kDefaultColumnFamilyName, cfo}, {"blocks", cfo}, {"records", cfo}};
}

rocksdb::DBOptions db_options() {
    rocksdb::DBOptions dbo;
    dbo.create_if_missing = true;
    dbo.create_missing_column_families = true;
    dbo.keep_log_file_num = 4;
    dbo.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
    // A damaged log or MANIFEST fails the open instead of replaying up to the damage (the
    // default point-in-time recovery silently rolled sessions back to older turns); a
    // record torn at the log's very end (a write cut by a crash) is the one damage taken.
    dbo.paranoid_checks = true;
    dbo.wal_recovery_mode = rocksdb::WALRecoveryMode::kTolerateCorruptedTailRecords;
    return dbo;
}

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

}  // namespace deltaserve::kvstore::disk_layout
