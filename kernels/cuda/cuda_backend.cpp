// The "cuda" backend: probes for a device on first use; registered by cuda_registrar.cpp.
#include "cuda_backend.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cuda_status.h"
#include "deltaserve/common/logging.h"
#include "deltaserve/kernels/backend.h"
#include "rms_norm_rope.h"

namespace deltaserve::kernels::cuda {
namespace {

// Device memory owned by one op call. Move-only.
class DeviceBuffer {
  public:
    static Result<DeviceBuffer> create(size_t bytes) {
        DeviceBuffer buf;
        if (bytes == 0) return buf;
        DS_RETURN_IF_ERROR(from_cuda(cudaMalloc(&buf.ptr_, bytes), "cudaMalloc"));
        buf.bytes_ = bytes;
        return buf;
    }
    // Allocates and fills from host memory.
    static Result<DeviceBuffer> copy_of(const void* host, size_t bytes) {
        DS_ASSIGN_OR_RETURN(DeviceBuffer buf, create(bytes));
        if (bytes > 0) {
            DS_RETURN_IF_ERROR(from_cuda(cudaMemcpy(buf.ptr_, host, bytes, cudaMemcpyHostToDevice),
                                         "cudaMemcpy to device"));
        }
        return buf;
    }

    DeviceBuffer() = default;
    DeviceBuffer(DeviceBuffer&& o) noexcept
        : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
    DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
        std::swap(ptr_, o.ptr_);
        std::swap(bytes_, o.bytes_);
        return *this;
    }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    ~DeviceBuffer() {
        if (ptr_ != nullptr) (void)cudaFree(ptr_);  // nothing useful to do with an error here
    }

    template <typename T>
    T* as() const {
        return static_cast<T*>(ptr_);
    }
    Status copy_to_host(void* host) const {
        if (bytes_ == 0) return Status();
        return from_cuda(cudaMemcpy(host, ptr_, bytes_, cudaMemcpyDeviceToHost),
                         "cudaMemcpy to host");
    }

  private:
    void* ptr_ = nullptr;
    size_t bytes_ = 0;
};

class CudaBackend final : public Backend {
  public:
    std::string_view name() const override { return "cuda"; }

    bool available() const override {
        std::call_once(probe_once_, [this] { probe(); });
        return no_device_.ok();
    }

    Status rms_norm_rope(const RmsNormRopeParams& p, const float* x, const float* weight,
                         const int64_t* positions, float* out) override {
        DS_RETURN_IF_ERROR(validate(p));
        if (!available()) return no_device_;
        if (p.n_rows == 0) return Status();
        if (p.n_rows > 0x7fffffff) return invalid_argument("cuda rms_norm_rope: n_rows > 2^31-1");
        const size_t rows_bytes = static_cast<size_t>(p.n_rows * p.d_model) * sizeof(float);

        // Same expression as kernels::rope() so theta matches the reference bit for bit.
        std::vector<float> inv_freq(static_cast<size_t>(p.n_heads > 0 ? p.head_dim / 2 : 0));
        for (size_t j = 0; j < inv_freq.size(); ++j) {
            inv_freq[j] = std::pow(p.rope_base,
                                   -2.0f * static_cast<float>(j) / static_cast<float>(p.head_dim));
        }

        DS_ASSIGN_OR_RETURN(DeviceBuffer d_x, DeviceBuffer::copy_of(x, rows_bytes));
        DS_ASSIGN_OR_RETURN(
            DeviceBuffer d_w,
            DeviceBuffer::copy_of(weight, static_cast<size_t>(p.d_model) * sizeof(float)));
        DS_ASSIGN_OR_RETURN(
            DeviceBuffer d_freq,
            DeviceBuffer::copy_of(inv_freq.data(), inv_freq.size() * sizeof(float)));
        DeviceBuffer d_pos;
        if (p.n_heads > 0) {
            DS_ASSIGN_OR_RETURN(
                d_pos,
                DeviceBuffer::copy_of(positions, static_cast<size_t>(p.n_rows) * sizeof(int64_t)));
        }

        RmsNormRopeLaunch args;
        args.x = d_x.as<float>();
        args.weight = d_w.as<float>();
        args.positions = d_pos.as<int64_t>();
        args.inv_freq = d_freq.as<float>();
        args.out = d_x.as<float>();  // in place on the device copy
        args.n_rows = p.n_rows;
        args.d_model = p.d_model;
        args.n_heads = p.n_heads;
        args.head_dim = p.head_dim;
        args.eps = p.eps;
        args.interleaved = p.style == RopeStyle::kInterleaved;
        DS_RETURN_IF_ERROR(from_cuda(launch_rms_norm_rope(args, nullptr), "rms_norm_rope launch"));
        // Synchronous on the legacy default stream: also reports errors of the kernel run.
        return d_x.copy_to_host(out).with_context("cuda rms_norm_rope");
    }

  private:
    // Counts devices once. Without a driver cudaGetDeviceCount fails (error 35) and leaves
    // the count untouched, hence the 0 start and "any error means no GPU".
    void probe() const {
        int count = 0;
        const cudaError_t err = cudaGetDeviceCount(&count);
        std::string cause;
        if (err != cudaSuccess) {
            (void)cudaGetLastError();  // clear it so later unrelated calls do not see it
            cause = from_cuda(err, "cudaGetDeviceCount").message();
        } else if (count == 0) {
            cause = "cudaGetDeviceCount found 0 devices";
        }
        if (!cause.empty()) {
            no_device_ = Status(StatusCode::kUnavailable, "no CUDA device (" + cause + ")");
            spdlog::warn("no CUDA device; running on the CPU ({})", cause);
        }
    }

    mutable std::once_flag probe_once_;
    mutable Status no_device_;  // OK once a device was found; written only inside probe_once_
};

}  // namespace

bool register_cuda_backend() { return register_backend(std::make_unique<CudaBackend>()).ok(); }
}  // namespace deltaserve::kernels::cuda
