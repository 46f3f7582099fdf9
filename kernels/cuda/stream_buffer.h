// Device memory for one op call, ordered on its stream. Private to kernels/cuda.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

#include "cuda_status.h"
#include "deltaserve/common/status.h"

namespace deltaserve::kernels::cuda {

// cudaMallocAsync on a stream, and cudaFreeAsync when it goes: the stream frees it after the
// work queued before, so an op returns without waiting for its kernels. Move-only.
class StreamBuffer {
  public:
    static Result<StreamBuffer> create(size_t bytes, cudaStream_t stream) {
        StreamBuffer buf;
        buf.stream_ = stream;
        if (bytes == 0) return buf;
        DS_RETURN_IF_ERROR(from_cuda(cudaMallocAsync(&buf.ptr_, bytes, stream), "cudaMallocAsync"));
        return buf;
    }
    // Allocates and copies from host memory. Pass pageable memory (a std::vector): the copy
    // has read it when this returns (from pinned memory it would read it later).
    static Result<StreamBuffer> copy_of(const void* host, size_t bytes, cudaStream_t stream) {
        DS_ASSIGN_OR_RETURN(StreamBuffer buf, create(bytes, stream));
        if (bytes > 0) {
            DS_RETURN_IF_ERROR(
                from_cuda(cudaMemcpyAsync(buf.ptr_, host, bytes, cudaMemcpyHostToDevice, stream),
                          "cudaMemcpyAsync to the device"));
        }
        return buf;
    }

    StreamBuffer() = default;
    StreamBuffer(StreamBuffer&& o) noexcept
        : ptr_(std::exchange(o.ptr_, nullptr)), stream_(o.stream_) {}
    StreamBuffer& operator=(StreamBuffer&& o) noexcept {
        std::swap(ptr_, o.ptr_);
        std::swap(stream_, o.stream_);
        return *this;
    }
    StreamBuffer(const StreamBuffer&) = delete;
    StreamBuffer& operator=(const StreamBuffer&) = delete;
    ~StreamBuffer() {
        if (ptr_ != nullptr) (void)cudaFreeAsync(ptr_, stream_);  // nothing to do on error
    }

    void* data() const { return ptr_; }
    template <typename T>
    T* as() const {
        return static_cast<T*>(ptr_);
    }

  private:
    void* ptr_ = nullptr;
    cudaStream_t stream_ = nullptr;
};

}  // namespace deltaserve::kernels::cuda
