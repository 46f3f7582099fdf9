#include "shared_pool.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <sstream>

namespace deltaserve::transport {
namespace {

void put_u64(std::byte* out, uint64_t v) {
    for (int i = 0; i < 8; ++i) out[i] = static_cast<std::byte>(v >> (8 * i));
}

uint64_t get_u64(const std::byte* in) {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(in[i]) << (8 * i);
    return v;
}

Status unreachable(const PoolOffer& offer, const std::string& why) {
    return Status(StatusCode::kUnavailable, "cannot map the pool of process " +
                                                std::to_string(offer.pid) + ": " + why);
}

}  // namespace

std::string random_pool_name() {
    std::random_device rd;
    std::ostringstream name;
    name << "deltaserve-pool-" << std::hex << rd() << rd() << rd() << rd();
    return name.str();
}

std::string encode_offer(const PoolOffer& offer) {
    return "shm " + std::to_string(offer.pid) + " " + std::to_string(offer.fd) + " " +
           std::to_string(offer.size) + " " + offer.name;
}

std::optional<PoolOffer> parse_offer(std::string_view text) {
    const size_t at = text.find("shm ");
    if (at == std::string_view::npos) return std::nullopt;
    std::istringstream in{std::string(text.substr(at + 4))};
    PoolOffer offer;
    if (!(in >> offer.pid >> offer.fd >> offer.size >> offer.name)) return std::nullopt;
    if (offer.pid <= 0 || offer.fd < 0 || offer.size == 0 ||
        offer.name.rfind("deltaserve-pool-", 0) != 0) {
        return std::nullopt;
    }
    return offer;
}

Result<std::unique_ptr<PeerPool>> PeerPool::map(const PoolOffer& offer) {
    const std::string path =
        "/proc/" + std::to_string(offer.pid) + "/fd/" + std::to_string(offer.fd);
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return unreachable(offer, path + ": " + std::strerror(errno));
    // Check what was opened, not what the path named a moment before.
    char target[256] = {};
    const std::string self = "/proc/self/fd/" + std::to_string(fd);
    const ssize_t n = readlink(self.c_str(), target, sizeof(target) - 1);
    const std::string expected = "/memfd:" + offer.name;
    struct stat st {};
    std::string why;
    if (n <= 0 || std::string_view(target, static_cast<size_t>(n)).rfind(expected, 0) != 0) {
        why = "it is another file (" + path + ")";
    } else if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < offer.size) {
        why = "its size is not " + std::to_string(offer.size);
    } else if ((fcntl(fd, F_GET_SEALS) & F_SEAL_SHRINK) == 0) {
        why = "its size is not sealed";
    }
    if (!why.empty()) {
        ::close(fd);
        return unreachable(offer, why);
    }
    void* p = mmap(nullptr, offer.size, PROT_READ, MAP_SHARED, fd, 0);
    const int err = errno;
    ::close(fd);
    if (p == MAP_FAILED) return unreachable(offer, std::string("mmap: ") + std::strerror(err));
    return std::unique_ptr<PeerPool>(new PeerPool(static_cast<const std::byte*>(p), offer.size));
}

PeerPool::~PeerPool() { munmap(const_cast<std::byte*>(base_), size_); }

const std::byte* PeerPool::at(uint64_t offset, uint64_t length) const {
    if (offset > size_ || length > size_ - offset) return nullptr;
    return base_ + offset;
}

void append_ref(std::vector<std::byte>& header, const PoolRef& ref) {
    const size_t at = header.size();
    header.resize(at + kPoolRefBytes);
    put_u64(header.data() + at, ref.offset);
    put_u64(header.data() + at + 8, ref.length);
    put_u64(header.data() + at + 16, ref.seq);
}

std::optional<PoolRef> take_ref(const void* header, size_t length, size_t* app_length) {
    if (length < kPoolRefBytes) return std::nullopt;
    const auto* tail = static_cast<const std::byte*>(header) + length - kPoolRefBytes;
    *app_length = length - kPoolRefBytes;
    return PoolRef{get_u64(tail), get_u64(tail + 8), get_u64(tail + 16)};
}

std::string encode_ack(uint64_t seq) {
    std::string out(8, '\0');
    put_u64(reinterpret_cast<std::byte*>(out.data()), seq);
    return out;
}

std::optional<uint64_t> parse_ack(const void* header, size_t length) {
    if (length != 8) return std::nullopt;
    return get_u64(static_cast<const std::byte*>(header));
}

}  // namespace deltaserve::transport
