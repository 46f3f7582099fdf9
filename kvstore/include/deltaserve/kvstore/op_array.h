// An array a backend's ops read or write, for a cache whose memory may be a device's
// (DeltaKvSequenceCache's scratch).
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "deltaserve/common/status.h"
#include "deltaserve/kernels/backend.h"

namespace deltaserve::kvstore {

// In host memory (no device bound) the array is `host` itself: ops() grows it and hands out
// its data, pull() and push() do nothing, so host code pays nothing. On a device it is a
// buffer there, which ops() grows (at least doubling; the contents are not kept), pull()
// copies into `host` and push() from it: host code reads and writes `host` only, between.
// The copies run on the device's default stream for the calling thread, as the ops do.
template <class T>
class OpArray {
  public:
    std::vector<T> host;

    void bind(kernels::Backend* device) { device_ = device; }
    // Room for n elements where the ops take them. Errors: the device's (allocation).
    Result<T*> ops(size_t n) {
        if (device_ == nullptr) {
            if (host.size() < n) host.resize(n);
            return host.data();
        }
        if (buf_.bytes() < n * sizeof(T)) {
            const size_t want = std::max(n * sizeof(T), 2 * buf_.bytes());
            buf_ = kernels::Buffer();
            DS_ASSIGN_OR_RETURN(buf_, device_->alloc(want));
        }
        return static_cast<T*>(buf_.data());
    }
    // The ops' first n elements into `host` (grown), or `host`'s first n to the ops' array.
    Status pull(size_t n) {
        if (device_ == nullptr || n == 0) return Status();
        if (host.size() < n) host.resize(n);
        return device_->copy_out(host.data(), buf_.data(), n * sizeof(T), kernels::Exec{});
    }
    Status push(size_t n) {
        if (device_ == nullptr || n == 0) return Status();
        DS_ASSIGN_OR_RETURN(T * to, ops(n));
        return device_->copy_in(to, host.data(), n * sizeof(T), kernels::Exec{});
    }
    // As a mirror of host memory `src` whose first `synced` elements are on the device
    // already: makes the device array hold src[0, n) (the rest copied, or all of it where the
    // buffer had to grow). Nothing in host memory.
    Status sync(const T* src, size_t n, size_t& synced) {
        if (device_ == nullptr) return Status();
        if (buf_.bytes() < n * sizeof(T)) {
            DS_RETURN_IF_ERROR(ops(n).status());
            synced = 0;
        }
        synced = std::min(synced, n);
        if (n > synced) {
            DS_RETURN_IF_ERROR(device_->copy_in(static_cast<T*>(buf_.data()) + synced, src + synced,
                                                (n - synced) * sizeof(T), kernels::Exec{}));
        }
        synced = n;
        return Status();
    }
    // The ops' array as it is (nullptr before the first ops(); `host` in host memory).
    const T* data() const {
        return device_ == nullptr ? host.data() : static_cast<const T*>(buf_.data());
    }
    // Gives the memory back, host and device.
    void release() {
        std::vector<T>().swap(host);
        buf_ = kernels::Buffer();
    }

  private:
    kernels::Backend* device_ = nullptr;
    kernels::Buffer buf_;
};

}  // namespace deltaserve::kvstore
