// What keeps the disk tier's RocksDB index safe from its disk (disk_tier.h):
//
// - The free-space gate. Debian's RocksDB 7.8 keeps its assertions on, and a WAL writer that
//   saw one failed append aborts the process at the next sync, Resume() or Close()
//   (writable_file_writer.h, `sync_without_flush_called_`). So the index is never let reach a
//   full disk: every write first checks the file system's free space (statvfs) against a
//   reserve. A write that fails anyway (EIO, EROFS, a disk filled by someone else between the
//   check and the write) poisons the handle: no write, sync or close touches it again.
// - The commit witness (DIR/COMMITTED): the index's last synced sequence number, written
//   after each synced commit. RocksDB cannot tell a write-ahead log cut at a record boundary,
//   or an index deleted whole, from a store that never had those writes; the witness can. It
//   is written without a sync after the synced commit it names, so it is never ahead of what
//   is durable (a power loss may leave it behind, which only weakens the check).
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include "deltaserve/common/status.h"

namespace deltaserve::kvstore {

// Bytes an unprivileged writer may still use on the file system holding `path`; nullopt
// when statvfs fails.
std::optional<uint64_t> free_bytes(const std::string& path);

class CommitWitness {
  public:
    // The witness of the store in `dir` (DIR/COMMITTED). Nothing is read or written yet.
    explicit CommitWitness(std::string dir);
    ~CommitWitness();
    CommitWitness(const CommitWitness&) = delete;
    CommitWitness& operator=(const CommitWitness&) = delete;

    const std::string& path() const { return path_; }
    // The sequence it names: 0 when there is no witness (a new store, or one made before
    // witnesses). kDataLoss when the file is there but does not parse.
    Result<uint64_t> read() const;
    // Records `seq` when it is above what was recorded. An I/O error is returned (the index
    // write it follows stands; the check at the next open is only weaker).
    Status advance(uint64_t seq);

  private:
    const std::string path_;
    std::mutex mu_;
    int fd_ = -1;
    uint64_t written_ = 0;
};

}  // namespace deltaserve::kvstore
