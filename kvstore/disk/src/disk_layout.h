// The disk tier's layout on disk (disk_tier.h), shared by the tier and its repair
// (disk_repair.cpp): the index's column families and options, its block entries, and the
// payload files' names.
#pragma once

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/slice.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace deltaserve::kvstore::disk_layout {

// The index's column families: default (unused), "blocks" (key -> Entry) and "records".
std::vector<rocksdb::ColumnFamilyDescriptor> column_families();
// The options every open of the index uses: a damaged log or MANIFEST fails the open.
rocksdb::DBOptions db_options();

// Index keys are big-endian, so the index iterates in key order.
std::string index_key(uint64_t key);
uint64_t parse_index_key(const rocksdb::Slice& s);

// A block's entry: its payload file's generation, its size, its write order.
struct Entry {
    uint64_t gen = 0, size = 0, seq = 0;
};
std::string encode_entry(const Entry& e);
bool decode_entry(const rocksdb::Slice& s, Entry* e);

// "<key, 16 hex digits>-<gen, 8 hex digits>.blk"
std::string file_name(uint64_t key, uint64_t gen);
bool parse_hex(std::string_view s, uint64_t* out);
bool parse_file_name(std::string_view name, uint64_t* key, uint64_t* gen);

// Reads out.size() bytes from the start of fd and closes it: 0, or the errno (EIO for a file
// shorter than that).
int read_all(int fd, std::vector<uint8_t>& out);

}  // namespace deltaserve::kvstore::disk_layout
