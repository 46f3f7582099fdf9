// The "cuda" backend: probes for a device on first use; registered by cuda_registrar.cpp.
// The forward pass's ops run on the Exec's stream (nullptr: cudaStreamPerThread) over device
// memory; their host side is forward_ops.cpp. Uploaded weights live until the backend goes.
#include "cuda_backend.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cuda_status.h"
#include "deltaserve/common/logging.h"
#include "deltaserve/kernels/backend.h"
#include "deltaserve/kernels/repack.h"
#include "forward_ops.h"
#include "latent_ops.h"
#include "rms_norm_rope.h"
#include "row_major.h"

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
    // Hands the memory over to the caller (who frees it with cudaFree).
    void* release() {
        bytes_ = 0;
        return std::exchange(ptr_, nullptr);
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

cudaStream_t stream_of(const Exec& exec) {
    return exec.stream != nullptr ? static_cast<cudaStream_t>(exec.stream) : cudaStreamPerThread;
}

class CudaBackend final : public Backend {
  public:
    ~CudaBackend() override {
        for (void* w : weights_) (void)cudaFree(w);  // at exit the runtime may be gone already
    }

    std::string_view name() const override { return "cuda"; }

    bool available() const override {
        std::call_once(probe_once_, [this] { probe(); });
        return no_device_.ok();
    }
    Status availability() const override {
        available();
        return no_device_;
    }
    size_t free_memory() const override {
        size_t free = 0, total = 0;
        if (!available() || cudaMemGetInfo(&free, &total) != cudaSuccess) {
            (void)cudaGetLastError();
            return 0;
        }
        return free;
    }
    std::string description() const override {
        return available() ? "cuda: " + device_ : "cuda (no device)";
    }

    Status rms_norm_rope(const RmsNormRopeParams& p, const float* x, const float* weight,
                         const int64_t* positions, float* out) override {
        DS_RETURN_IF_ERROR(validate(p));
        if (!available()) return no_device_;
        if (p.n_rows == 0) return Status();
        if (p.n_rows > 0x7fffffff) return invalid_argument("cuda rms_norm_rope: n_rows > 2^31-1");
        const size_t rows_bytes = static_cast<size_t>(p.n_rows * p.d_model) * sizeof(float);

        DS_ASSIGN_OR_RETURN(DeviceBuffer d_x, DeviceBuffer::copy_of(x, rows_bytes));
        DS_ASSIGN_OR_RETURN(
            DeviceBuffer d_w,
            DeviceBuffer::copy_of(weight, static_cast<size_t>(p.d_model) * sizeof(float)));
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
        args.out = d_x.as<float>();  // in place on the device copy
        args.n_rows = p.n_rows;
        args.d_model = p.d_model;
        args.n_heads = p.n_heads;
        args.head_dim = p.head_dim;
        args.eps = p.eps;
        // Same expression as kernels::rope() so theta matches the reference bit for bit.
        args.theta_scale =
            p.n_heads > 0 ? std::pow(p.rope_base, -2.0f / static_cast<float>(p.head_dim)) : 0.0f;
        args.interleaved = p.style == RopeStyle::kInterleaved;
        DS_RETURN_IF_ERROR(from_cuda(launch_rms_norm_rope(args, nullptr), "rms_norm_rope launch"));
        // Synchronous on the legacy default stream: also reports errors of the kernel run.
        return d_x.copy_to_host(out).with_context("cuda rms_norm_rope");
    }

    // --- The forward pass's ops: no device, no op (before any argument is looked at).

    Status copy_in(void* dst, const void* host_src, size_t bytes, const Exec& exec) override {
        if (!available()) return no_device_;
        if (bytes == 0) return Status();
        return from_cuda(
            cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_of(exec)),
            "cuda copy_in");
    }
    // Synchronizes the stream, so it reports the errors of the kernels queued before.
    Status copy_out(void* host_dst, const void* src, size_t bytes, const Exec& exec) override {
        if (!available()) return no_device_;
        const cudaStream_t stream = stream_of(exec);
        if (bytes > 0) {
            DS_RETURN_IF_ERROR(
                from_cuda(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream),
                          "cuda copy_out"));
        }
        return from_cuda(cudaStreamSynchronize(stream), "cuda copy_out");
    }
    Status synchronize(const Exec& exec) override {
        if (!available()) return no_device_;
        return from_cuda(cudaStreamSynchronize(stream_of(exec)), "cuda synchronize");
    }
    Status copy(void* dst, const void* src, size_t bytes, const Exec& exec) override {
        if (!available()) return no_device_;
        if (bytes == 0) return Status();
        return from_cuda(
            cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_of(exec)),
            "cuda copy");
    }

    // Row-major on the device whatever the host layout (the kernels read one layout).
    Result<WeightMatrix> upload_weight(const WeightMatrix& host) override {
        if (!available()) return no_device_;
        DS_RETURN_IF_ERROR(check_upload(host));
        const size_t bytes = static_cast<size_t>(host.rows) * host.row_stride();
        WeightMatrix on = host;
        on.interleave = 1;
        on.data = nullptr;
        if (bytes == 0) return on;
        std::vector<uint8_t> row_major;
        const void* src = host.data;
        if (host.interleave == kRowInterleave) {
            row_major.resize(bytes);
            deinterleave_rows(host, row_major.data());
            src = row_major.data();
        }
        DS_ASSIGN_OR_RETURN(DeviceBuffer dev, DeviceBuffer::copy_of(src, bytes));
        std::lock_guard lock(weights_mu_);
        weights_.push_back(dev.as<void>());
        on.data = dev.release();
        return on;
    }

    Status rms_norm_rows(const float* x, int64_t ldx, const float* weight, int64_t d, int64_t n,
                         float eps, float* out, int64_t ldo, const Exec& exec) override {
        if (!available()) return no_device_;
        return run_rms_norm_rows(x, ldx, weight, d, n, eps, out, ldo, stream_of(exec));
    }
    Status matmul(const WeightMatrix& w, const float* x, int64_t ldx, int64_t n, float* y,
                  int64_t ldy, const Exec& exec) override {
        if (!available()) return no_device_;
        return run_matmul(w, x, ldx, n, y, ldy, stream_of(exec));
    }
    Status matmul_shared_input(std::span<const MatmulOutput> outputs, const float* x, int64_t ldx,
                               int64_t n, const Exec& exec) override {
        if (!available()) return no_device_;
        return run_matmul_shared_input(outputs, x, ldx, n, stream_of(exec));
    }
    using Backend::rope_rows;  // and its plain-RoPE form
    Status rope_rows(float* x, int64_t ldx, int64_t n, int n_heads, int head_dim,
                     const int32_t* positions, const RopeParams& rope, const Exec& exec) override {
        if (!available()) return no_device_;
        return run_rope_rows(x, ldx, n, n_heads, head_dim, positions, rope, stream_of(exec));
    }
    Status silu_mul(float* out, const float* gate, const float* up, int64_t n,
                    const Exec& exec) override {
        if (!available()) return no_device_;
        return run_silu_mul(out, gate, up, n, stream_of(exec));
    }
    Status add(float* y, const float* x, int64_t n, const Exec& exec) override {
        if (!available()) return no_device_;
        return run_add(y, x, n, stream_of(exec));
    }
    Status gelu_mul(float* out, const float* gate, const float* up, int64_t n,
                    const Exec& exec) override {
        if (!available()) return no_device_;
        return run_gelu_mul(out, gate, up, n, stream_of(exec));
    }
    Status scale(float* x, float s, int64_t n, const Exec& exec) override {
        if (!available()) return no_device_;
        return run_scale(x, s, n, stream_of(exec));
    }
    Status embed_rows(const WeightMatrix& table, const int32_t* tokens, int64_t n, float* out,
                      const Exec& exec) override {
        if (!available()) return no_device_;
        return run_embed_rows(table, tokens, n, out, stream_of(exec));
    }
    Status store_rows(DType dtype, int64_t width, const float* src, int64_t ld, int64_t n,
                      uint8_t* dst, size_t row_stride, const int32_t* slots,
                      const Exec& exec) override {
        if (!available()) return no_device_;
        return run_store_rows(dtype, width, src, ld, n, dst, row_stride, slots, stream_of(exec));
    }
    Status copy_rows(uint8_t* dst, size_t dst_stride, const int32_t* dst_rows, const uint8_t* src,
                     size_t src_stride, const int32_t* src_rows, size_t row_bytes, int64_t n,
                     const Exec& exec) override {
        if (!available()) return no_device_;
        return run_copy_rows(dst, dst_stride, dst_rows, src, src_stride, src_rows, row_bytes, n,
                             stream_of(exec));
    }
    Status attention(const AttentionShape& shape, const KvView& kv, const float* q, int64_t ldq,
                     int32_t n_q, float* out, int64_t ldo, const Exec& exec) override {
        if (!available()) return no_device_;
        return run_attention(shape, kv, q, ldq, n_q, out, ldo, stream_of(exec));
    }
    Status attention_batch(const AttentionShape& shape, std::span<const AttentionJob> jobs,
                           const float* q, int64_t ldq, float* out, int64_t ldo,
                           const Exec& exec) override {
        if (!available()) return no_device_;
        return run_attention_batch(shape, jobs, q, ldq, out, ldo, stream_of(exec));
    }
    Status top_k(const float* logits, int64_t n_vocab, int64_t n_rows, int32_t k, int32_t* ids,
                 float* values, const Exec& exec) override {
        if (!available()) return no_device_;
        return run_top_k(logits, n_vocab, n_rows, k, ids, values, stream_of(exec));
    }

    Status attention_lse(const AttentionShape& shape, const KvView& kv, const float* q, int64_t ldq,
                         int32_t n_q, float* out, int64_t ldo, float* lse, bool causal,
                         const Exec& exec) override {
        if (!available()) return no_device_;
        return run_attention_lse(shape, kv, q, ldq, n_q, out, ldo, lse, causal, stream_of(exec));
    }
    Status merge_attention(float* out, float* lse, const float* out_b, const float* lse_b,
                           int n_rows, int head_dim, const Exec& exec) override {
        if (!available()) return no_device_;
        return run_merge_attention(out, lse, out_b, lse_b, n_rows, head_dim, stream_of(exec));
    }
    // One allocation: the weights, then the scales and the row sums.
    Result<Int4DecoderRef> upload_int4_decoder(const Int4Decoder& host) override {
        if (!available()) return no_device_;
        const size_t w_bytes = host.w.size(), rows = static_cast<size_t>(host.d);
        if (host.d <= 0 || host.m16 % 16 != 0 || w_bytes != rows * host.m16 ||
            host.scale.size() != rows || host.row_sum.size() != rows) {
            return invalid_argument(
                "cuda upload_int4_decoder: the decoder's arrays do not match its shape");
        }
        const size_t w_padded = (w_bytes + 15) / 16 * 16;
        std::vector<uint8_t> staged(w_padded + 2 * rows * sizeof(float));
        std::memcpy(staged.data(), host.w.data(), w_bytes);
        std::memcpy(staged.data() + w_padded, host.scale.data(), rows * sizeof(float));
        std::memcpy(staged.data() + w_padded + rows * sizeof(float), host.row_sum.data(),
                    rows * sizeof(float));
        DS_ASSIGN_OR_RETURN(DeviceBuffer dev, DeviceBuffer::copy_of(staged.data(), staged.size()));
        std::lock_guard lock(weights_mu_);
        weights_.push_back(dev.as<void>());
        auto* base = static_cast<uint8_t*>(dev.release());
        Int4DecoderRef ref;
        ref.d = host.d;
        ref.m = host.m;
        ref.m16 = host.m16;
        ref.w = reinterpret_cast<const int8_t*>(base);
        ref.scale = reinterpret_cast<const float*>(base + w_padded);
        ref.row_sum = ref.scale + rows;
        return ref;
    }
    Status max_head_scores(const AttentionShape& shape, const float* q, const PoolKeys& keys,
                           float* scores, const Exec& exec) override {
        if (!available()) return no_device_;
        return run_max_head_scores(shape, q, keys, scores, stream_of(exec));
    }
    Status deltakv_encode(const LatentEncodeInputs& in, const float* x, int64_t n,
                          const LatentEncodeOutputs& out, const Exec& exec) override {
        if (!available()) return no_device_;
        return run_deltakv_encode(in, x, n, out, stream_of(exec));
    }
    Status deltakv_pool_rows(const PoolRows& rows, float* out, const Exec& exec) override {
        if (!available()) return no_device_;
        return run_deltakv_pool_rows(rows, out, stream_of(exec));
    }
    Status deltakv_key_scores(const AttentionShape& shape, const LatentRows& lat,
                              const LatentDecodeInputs& in, const float* q, float* scores,
                              int64_t lds, uint8_t* codes, const Exec& exec) override {
        if (!available()) return no_device_;
        return run_deltakv_key_scores(shape, lat, in, q, scores, lds, codes, stream_of(exec));
    }
    Status deltakv_reconstruct(const AttentionShape& shape, const LatentRows& lat,
                               const LatentDecodeInputs& in, uint8_t* k_out, uint8_t* v_out,
                               size_t out_stride, const Exec& exec) override {
        if (!available()) return no_device_;
        return run_deltakv_reconstruct(shape, lat, in, k_out, v_out, out_stride, stream_of(exec));
    }
    Status latent_attention(const AttentionShape& shape, const LatentRows& lat, const float* scores,
                            const LatentValueInputs& in, float* out, float* lse,
                            const Exec& exec) override {
        if (!available()) return no_device_;
        return run_latent_attention(shape, lat, scores, in, out, lse, stream_of(exec));
    }

  protected:
    // nullptr without a device or memory (alloc then says kResourceExhausted).
    void* allocate(size_t bytes) override {
        if (bytes == 0 || !available()) return nullptr;
        void* p = nullptr;
        if (!from_cuda(cudaMalloc(&p, bytes), "cudaMalloc").ok()) return nullptr;
        return p;
    }
    void deallocate(void* data, size_t) override {
        if (data != nullptr) (void)cudaFree(data);
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
            // Not a warning: most machines have none, and choose_backend says what runs.
            spdlog::debug("no CUDA device ({})", cause);
            return;
        }
        cudaDeviceProp prop{};
        if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
            device_ = std::string(prop.name) + " (sm_" + std::to_string(prop.major) +
                      std::to_string(prop.minor) + ", " +
                      std::to_string(prop.totalGlobalMem >> 30) + " GiB)";
        } else {
            (void)cudaGetLastError();
            device_ = "device 0";
        }
    }

    mutable std::once_flag probe_once_;
    mutable Status no_device_;    // OK once a device was found; written only inside probe_once_
    mutable std::string device_;  // its name, compute capability and memory; likewise
    std::mutex weights_mu_;
    std::vector<void*> weights_;  // upload_weight's device copies, freed with the backend
};

}  // namespace

bool register_cuda_backend() { return register_backend(std::make_unique<CudaBackend>()).ok(); }
}  // namespace deltaserve::kernels::cuda
