// Buffer and BufferPool: the memory messages travel in.
//
// A BufferPool is one page-aligned region carved into buffers on demand (first fit, 64-byte
// granules). A transport registers the region with its network layer once (UCX: ucp_mem_map)
// so sends and receives from pool buffers need no per-message registration. acquire() waits
// while the pool is full: that is the sender's backpressure when the network is slower than
// the producer. A Buffer returns its bytes to the pool when destroyed; it keeps the pool
// alive, so buffers may outlive the transport that handed them out.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string_view>

#include "deltaserve/common/status.h"

namespace deltaserve::transport {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

inline Deadline deadline_in(std::chrono::milliseconds ms) { return Clock::now() + ms; }

class BufferPool;

// A move-only byte buffer, from a pool or from the heap.
class Buffer {
  public:
    Buffer() = default;
    Buffer(Buffer&& other) noexcept;
    Buffer& operator=(Buffer&& other) noexcept;
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    ~Buffer();

    // An unregistered heap buffer of n bytes (contents unspecified).
    static Buffer heap(size_t n);
    // A heap buffer holding a copy of bytes.
    static Buffer copy_of(std::span<const std::byte> bytes);

    std::byte* data() { return data_; }
    const std::byte* data() const { return data_; }
    size_t size() const { return size_; }
    bool empty() const { return size_ == 0; }
    std::span<std::byte> span() { return {data_, size_}; }
    std::span<const std::byte> span() const { return {data_, size_}; }

    // The pool this buffer came from, or null for a heap buffer.
    const BufferPool* pool() const { return pool_.get(); }

  private:
    friend class BufferPool;
    void reset();

    std::byte* data_ = nullptr;
    size_t size_ = 0;
    std::shared_ptr<BufferPool> pool_;  // set for pool buffers
    size_t pool_offset_ = 0;
    size_t pool_span_ = 0;
    std::unique_ptr<std::byte[]> heap_;  // set for heap buffers
};

// A registered memory region handed out as Buffers. Thread-safe.
class BufferPool : public std::enable_shared_from_this<BufferPool> {
  public:
    // Called once with the region when the pool is made; returns an opaque registration
    // handle (kept as registration()) or an error. The deregister hook runs when the pool is
    // destroyed, after every buffer came back.
    using RegisterFn = std::function<Result<void*>(std::span<std::byte> region)>;
    using DeregisterFn = std::function<void(void* registration)>;

    // A pool of `bytes` bytes (rounded up to pages); with reg or a share_name its pages are
    // allocated now, else as they are used. With a share_name the region is a memory file
    // (memfd, named share_name, its size sealed) that other processes of this host may map
    // read-only through /proc (share_fd()); where the kernel cannot make one the pool is
    // private memory (share_fd() -1). Errors: the region cannot be mapped or registered.
    static Result<std::shared_ptr<BufferPool>> create(size_t bytes, RegisterFn reg = nullptr,
                                                      DeregisterFn dereg = nullptr,
                                                      std::string_view share_name = {});
    ~BufferPool();

    BufferPool(const BufferPool&) = delete;
    BufferPool& operator=(const BufferPool&) = delete;

    // A buffer of n bytes, waiting while the pool is full. n larger than the whole pool gets
    // a heap buffer at once. Errors: kDeadlineExceeded when no room freed up in time.
    Result<Buffer> acquire(size_t n, Deadline deadline);
    // A buffer of n bytes if the pool has room now, else an empty Buffer.
    Buffer try_acquire(size_t n);

    size_t capacity() const { return size_; }
    size_t bytes_in_use() const;
    void* registration() const { return registration_; }
    // The memory file behind a shareable pool, or -1.
    int share_fd() const { return share_fd_; }
    // Where p lies in the pool (p must be inside it).
    size_t offset_of(const void* p) const {
        return static_cast<size_t>(static_cast<const std::byte*>(p) - base_);
    }
    bool contains(const void* p) const {
        return p >= base_ && p < static_cast<const std::byte*>(base_) + size_;
    }

  private:
    friend class Buffer;
    struct State;
    BufferPool() = default;
    void release(size_t offset, size_t span);

    std::byte* base_ = nullptr;
    size_t size_ = 0;
    void* registration_ = nullptr;
    int share_fd_ = -1;
    DeregisterFn dereg_;
    std::unique_ptr<State> state_;
};

}  // namespace deltaserve::transport
