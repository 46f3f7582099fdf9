// The disk tier's free-space gate and commit witness (store_guard.h).
#include "store_guard.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cinttypes>
#include <cstdio>
#include <cstring>

namespace deltaserve::kvstore {

namespace {

// "seq " and 20 decimal digits and a newline: always the same size, so a rewrite in place
// never leaves a tail of an older, longer value.
constexpr size_t kWitnessBytes = 4 + 20 + 1;

}  // namespace

std::optional<uint64_t> free_bytes(const std::string& path) {
    struct statvfs st {};
    if (::statvfs(path.c_str(), &st) != 0) return std::nullopt;
    return static_cast<uint64_t>(st.f_bavail) * static_cast<uint64_t>(st.f_frsize);
}

CommitWitness::CommitWitness(std::string dir) : path_(std::move(dir) + "/COMMITTED") {}

CommitWitness::~CommitWitness() {
    if (fd_ >= 0) ::close(fd_);
}

Result<uint64_t> CommitWitness::read() const {
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) return uint64_t{0};
        return data_loss("cannot read " + path_ + ": " + std::strerror(errno));
    }
    char buf[kWitnessBytes + 1];
    const ssize_t n = ::pread(fd, buf, sizeof buf, 0);
    ::close(fd);
    uint64_t seq = 0;
    const bool parsed =
        n == static_cast<ssize_t>(kWitnessBytes) && std::memcmp(buf, "seq ", 4) == 0 &&
        buf[kWitnessBytes - 1] == '\n' &&
        std::from_chars(buf + 4, buf + kWitnessBytes - 1, seq).ptr == buf + kWitnessBytes - 1;
    if (!parsed) return data_loss(path_ + " (the index's commit record) does not parse");
    return seq;
}

Status CommitWitness::advance(uint64_t seq) {
    std::lock_guard lock(mu_);
    if (seq <= written_ && fd_ >= 0) return Status();
    if (fd_ < 0) {
        fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd_ < 0) return unavailable("cannot open " + path_ + ": " + std::strerror(errno));
    }
    char buf[kWitnessBytes + 1];
    std::snprintf(buf, sizeof buf, "seq %020" PRIu64 "\n", seq);
    if (::pwrite(fd_, buf, kWitnessBytes, 0) != static_cast<ssize_t>(kWitnessBytes))
        return unavailable("cannot write " + path_ + ": " + std::strerror(errno));
    written_ = seq;
    return Status();
}

}  // namespace deltaserve::kvstore
