#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "deltaserve/transport/buffer.h"

namespace deltaserve::transport {
namespace {

constexpr size_t kGranule = 64;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// A memory file of `size` bytes whose size is sealed (a process that maps it cannot be made
// to fault by its owner shrinking it), or -1.
int shared_file(const std::string& name, size_t size) {
    const int fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return -1;
    if (ftruncate(fd, static_cast<off_t>(size)) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        ::close(fd);
        return -1;
    }
    return fd;
}

}  // namespace

// ---- Buffer ----

Buffer::Buffer(Buffer&& other) noexcept { *this = std::move(other); }

Buffer& Buffer::operator=(Buffer&& other) noexcept {
    if (this == &other) return *this;
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    pool_ = std::move(other.pool_);
    pool_offset_ = std::exchange(other.pool_offset_, 0);
    pool_span_ = std::exchange(other.pool_span_, 0);
    heap_ = std::move(other.heap_);
    return *this;
}

Buffer::~Buffer() { reset(); }

void Buffer::reset() {
    if (pool_) pool_->release(pool_offset_, pool_span_);
    pool_.reset();
    heap_.reset();
    data_ = nullptr;
    size_ = 0;
}

Buffer Buffer::heap(size_t n) {
    Buffer b;
    b.heap_ = std::make_unique_for_overwrite<std::byte[]>(n == 0 ? 1 : n);
    b.data_ = b.heap_.get();
    b.size_ = n;
    return b;
}

Buffer Buffer::copy_of(std::span<const std::byte> bytes) {
    Buffer b = heap(bytes.size());
    if (!bytes.empty()) std::memcpy(b.data_, bytes.data(), bytes.size());
    return b;
}

// ---- BufferPool ----

struct BufferPool::State {
    mutable std::mutex mu;
    std::condition_variable freed;
    std::map<size_t, size_t> free;  // offset -> length, coalesced
    size_t in_use = 0;
};

Result<std::shared_ptr<BufferPool>> BufferPool::create(size_t bytes, RegisterFn reg,
                                                       DeregisterFn dereg,
                                                       std::string_view share_name) {
    if (bytes == 0) return invalid_argument("a buffer pool needs at least one byte");
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t size = round_up(bytes, page);
    const int fd = share_name.empty() ? -1 : shared_file(std::string(share_name), size);
    // A pool a network layer registers (or a peer maps) is populated now: the first payloads
    // do not pay a page fault per page. An unregistered one (the in-process transport's,
    // whose payloads move without copying) takes memory only as it is used.
    const int populate = fd >= 0 || reg ? MAP_POPULATE : 0;
    void* p = fd >= 0 ? mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | populate, fd, 0)
                      : mmap(nullptr, size, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS | populate, -1, 0);
    if (p == MAP_FAILED) {
        const int err = errno;
        if (fd >= 0) ::close(fd);
        return resource_exhausted("cannot map a buffer pool of " + std::to_string(size) +
                                  " bytes: " + std::strerror(err));
    }
    std::shared_ptr<BufferPool> pool(new BufferPool());
    pool->share_fd_ = fd;
    pool->base_ = static_cast<std::byte*>(p);
    pool->size_ = size;
    pool->state_ = std::make_unique<State>();
    pool->state_->free.emplace(0, size);
    if (reg) {
        auto handle = reg(std::span<std::byte>(pool->base_, size));
        if (!handle.ok()) return handle.error().with_context("registering a buffer pool");
        pool->registration_ = *handle;
        pool->dereg_ = std::move(dereg);
    }
    return pool;
}

BufferPool::~BufferPool() {
    if (dereg_ && registration_) dereg_(registration_);
    if (base_) munmap(base_, size_);
    if (share_fd_ >= 0) ::close(share_fd_);
}

size_t BufferPool::bytes_in_use() const {
    std::lock_guard lock(state_->mu);
    return state_->in_use;
}

Buffer BufferPool::try_acquire(size_t n) {
    const size_t span = round_up(n == 0 ? 1 : n, kGranule);
    std::lock_guard lock(state_->mu);
    for (auto it = state_->free.begin(); it != state_->free.end(); ++it) {
        if (it->second < span) continue;
        const size_t offset = it->first;
        const size_t rest = it->second - span;
        state_->free.erase(it);
        if (rest > 0) state_->free.emplace(offset + span, rest);
        state_->in_use += span;
        Buffer b;
        b.data_ = base_ + offset;
        b.size_ = n;
        b.pool_ = shared_from_this();
        b.pool_offset_ = offset;
        b.pool_span_ = span;
        return b;
    }
    return {};
}

Result<Buffer> BufferPool::acquire(size_t n, Deadline deadline) {
    if (round_up(n == 0 ? 1 : n, kGranule) > size_) return Buffer::heap(n);
    for (;;) {
        Buffer b = try_acquire(n);
        if (b.data() != nullptr) return b;
        std::unique_lock lock(state_->mu);
        // Re-check under the lock: a release between try_acquire and here would be missed.
        bool fits = false;
        const size_t span = round_up(n == 0 ? 1 : n, kGranule);
        for (const auto& [offset, len] : state_->free) fits = fits || len >= span;
        if (fits) continue;
        if (state_->freed.wait_until(lock, deadline) == std::cv_status::timeout &&
            Clock::now() >= deadline) {
            return Status(StatusCode::kDeadlineExceeded,
                          "buffer pool full: " + std::to_string(n) + " bytes did not free up (" +
                              std::to_string(state_->in_use) + " of " + std::to_string(size_) +
                              " bytes in use)");
        }
    }
}

void BufferPool::release(size_t offset, size_t span) {
    {
        std::lock_guard lock(state_->mu);
        auto& free = state_->free;
        auto next = free.lower_bound(offset);
        size_t begin = offset, len = span;
        if (next != free.begin()) {
            auto prev = std::prev(next);
            if (prev->first + prev->second == offset) {
                begin = prev->first;
                len += prev->second;
                free.erase(prev);
            }
        }
        if (next != free.end() && offset + span == next->first) {
            len += next->second;
            free.erase(next);
        }
        free.emplace(begin, len);
        state_->in_use -= span;
    }
    state_->freed.notify_all();
}

}  // namespace deltaserve::transport
