// The same-host payload path of the UCX backend: a peer on this host maps the sender's
// buffer pool (a sealed memory file) read-only, and a payload travels as its place in that
// pool; the receiver copies it out and acknowledges, and the sender's buffer goes back to
// its pool. UCX carries only the small messages (the hello, the reference, the ack), so its
// peer-failure handling still covers the connection, and a peer that dies leaves the
// survivor a valid mapping rather than a fault (UCX 1.13's own zero-copy shared memory,
// cma, is not used with peer-failure handling; transport/README.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "deltaserve/common/status.h"

namespace deltaserve::transport {

// What a process tells its peer so the peer can map its pool: the process, the memory
// file's descriptor there, its size and its name (a random name, checked after opening, so
// a reused pid or another pid namespace is refused rather than mapped).
struct PoolOffer {
    int64_t pid = 0;
    int fd = -1;
    size_t size = 0;
    std::string name;
};

// A fresh random name for a shareable pool ("deltaserve-pool-<hex>").
std::string random_pool_name();
// "shm <pid> <fd> <size> <name>"; parse_offer takes it from anywhere in text.
std::string encode_offer(const PoolOffer& offer);
std::optional<PoolOffer> parse_offer(std::string_view text);

// A peer's pool mapped read-only into this process. Unmapped when destroyed.
class PeerPool {
  public:
    // Errors: kUnavailable (the peer is not on this host or in reach: another pid namespace,
    // no permission, another file under that descriptor, a size that is not sealed).
    static Result<std::unique_ptr<PeerPool>> map(const PoolOffer& offer);
    ~PeerPool();
    PeerPool(const PeerPool&) = delete;
    PeerPool& operator=(const PeerPool&) = delete;

    // bytes [offset, offset + length) of the peer's pool, or null if outside it.
    const std::byte* at(uint64_t offset, uint64_t length) const;

  private:
    PeerPool(const std::byte* base, size_t size) : base_(base), size_(size) {}
    const std::byte* base_;
    size_t size_;
};

// Where a payload lies in the sender's pool, appended to the message header.
struct PoolRef {
    uint64_t offset = 0;
    uint64_t length = 0;
    uint64_t seq = 0;  // per connection and direction, from 0: the ack names the last copied
};
inline constexpr size_t kPoolRefBytes = 24;

void append_ref(std::vector<std::byte>& header, const PoolRef& ref);
// Splits header into the application's header and the trailing reference.
std::optional<PoolRef> take_ref(const void* header, size_t length, size_t* app_length);

std::string encode_ack(uint64_t seq);
std::optional<uint64_t> parse_ack(const void* header, size_t length);

}  // namespace deltaserve::transport
