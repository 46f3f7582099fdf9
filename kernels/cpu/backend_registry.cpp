// The backend registry, seeded with the CPU reference backend, and what every backend
// shares: validation, Buffer, and the defaults of the ops it does not implement.
#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "cpu_backend.h"
#include "deltaserve/common/logging.h"
#include "deltaserve/kernels/backend.h"

namespace deltaserve::kernels {

Status validate(const RmsNormRopeParams& p) {
    if (p.n_rows < 0) return invalid_argument("rms_norm_rope: n_rows < 0");
    if (p.d_model <= 0) return invalid_argument("rms_norm_rope: d_model must be > 0");
    if (p.n_heads < 0) return invalid_argument("rms_norm_rope: n_heads < 0");
    if (p.n_heads > 0) {
        if (p.head_dim < 2 || p.head_dim > 1024 || p.head_dim % 2 != 0) {
            return invalid_argument("rms_norm_rope: head_dim must be even and in [2, 1024], got " +
                                    std::to_string(p.head_dim));
        }
        if (static_cast<int64_t>(p.n_heads) * p.head_dim > p.d_model) {
            return invalid_argument("rms_norm_rope: n_heads * head_dim exceeds d_model");
        }
    }
    if (!(p.eps >= 0.0f)) return invalid_argument("rms_norm_rope: eps must be >= 0");
    return Status();
}

Status validate_rope(const RopeParams& r, int head_dim, std::string_view op) {
    const auto bad = [op](const std::string& why) {
        return invalid_argument(std::string(op) + ": " + why);
    };
    if (!(std::isfinite(r.base) && r.base > 0.0f)) return bad("the RoPE base must be > 0");
    if (!(std::isfinite(r.freq_scale) && r.freq_scale > 0.0f)) {
        return bad("the RoPE frequency scale must be finite and > 0");
    }
    if (r.freq_factors.empty()) return Status();
    if (static_cast<int64_t>(r.freq_factors.size()) * 2 != head_dim) {
        return bad(std::to_string(r.freq_factors.size()) + " RoPE frequency factors for heads of " +
                   std::to_string(head_dim) + " (head_dim / 2 wanted)");
    }
    for (float f : r.freq_factors) {
        if (!(std::isfinite(f) && f > 0.0f)) {
            return bad("a RoPE frequency factor is " + std::to_string(f) + " (finite, > 0 wanted)");
        }
    }
    return Status();
}

Status Backend::rms_norm_rope(const RmsNormRopeParams&, const float*, const float*, const int64_t*,
                              float*) {
    return unimplemented(std::string(name()) + ": rms_norm_rope is not implemented");
}

Buffer::Buffer(Buffer&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
    if (this != &other) {
        if (owner_ != nullptr) owner_->deallocate(data_, bytes_);
        owner_ = std::exchange(other.owner_, nullptr);
        data_ = std::exchange(other.data_, nullptr);
        bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
}

Buffer::~Buffer() {
    if (owner_ != nullptr) owner_->deallocate(data_, bytes_);
}

Result<Buffer> Backend::alloc(size_t bytes) {
    void* p = allocate(bytes);
    if (p == nullptr && bytes > 0)
        return resource_exhausted(std::string(name()) + ": cannot allocate " +
                                  std::to_string(bytes) + " bytes");
    return Buffer(p != nullptr ? this : nullptr, p, bytes);
}

void* Backend::allocate(size_t) { return nullptr; }
void Backend::deallocate(void*, size_t) {}

namespace {

Status not_here(const Backend& b, const char* op) {
    return unimplemented(std::string(b.name()) + ": " + op + " is not implemented");
}

}  // namespace

Status Backend::copy_in(void*, const void*, size_t, const Exec&) {
    return not_here(*this, "copy_in");
}
Status Backend::copy_out(void*, const void*, size_t, const Exec&) {
    return not_here(*this, "copy_out");
}
Status Backend::availability() const {
    if (available()) return Status();
    return unavailable("the " + std::string(name()) + " backend cannot run here");
}
Status Backend::copy(void*, const void*, size_t, const Exec&) { return not_here(*this, "copy"); }
Result<WeightMatrix> Backend::upload_weight(const WeightMatrix&) {
    return not_here(*this, "upload_weight");
}
Status Backend::rms_norm_rows(const float*, int64_t, const float*, int64_t, int64_t, float, float*,
                              int64_t, const Exec&) {
    return not_here(*this, "rms_norm_rows");
}
Status Backend::matmul(const WeightMatrix&, const float*, int64_t, int64_t, float*, int64_t,
                       const Exec&) {
    return not_here(*this, "matmul");
}
Status Backend::matmul_shared_input(std::span<const MatmulOutput>, const float*, int64_t, int64_t,
                                    const Exec&) {
    return not_here(*this, "matmul_shared_input");
}
Status Backend::rope_rows(float*, int64_t, int64_t, int, int, const int32_t*, const RopeParams&,
                          const Exec&) {
    return not_here(*this, "rope_rows");
}
Status Backend::silu_mul(float*, const float*, const float*, int64_t, const Exec&) {
    return not_here(*this, "silu_mul");
}
Status Backend::add(float*, const float*, int64_t, const Exec&) { return not_here(*this, "add"); }
Status Backend::gelu_mul(float*, const float*, const float*, int64_t, const Exec&) {
    return not_here(*this, "gelu_mul");
}
Status Backend::scale(float*, float, int64_t, const Exec&) { return not_here(*this, "scale"); }
Status Backend::embed_rows(const WeightMatrix&, const int32_t*, int64_t, float*, const Exec&) {
    return not_here(*this, "embed_rows");
}
Status Backend::store_rows(DType, int64_t, const float*, int64_t, int64_t, uint8_t*, size_t,
                           const int32_t*, const Exec&) {
    return not_here(*this, "store_rows");
}
Status Backend::copy_rows(uint8_t*, size_t, const int32_t*, const uint8_t*, size_t, const int32_t*,
                          size_t, int64_t, const Exec&) {
    return not_here(*this, "copy_rows");
}
Status Backend::attention(const AttentionShape&, const KvView&, const float*, int64_t, int32_t,
                          float*, int64_t, const Exec&) {
    return not_here(*this, "attention");
}
Status Backend::attention_batch(const AttentionShape& shape, std::span<const AttentionJob> jobs,
                                const float* q, int64_t ldq, float* out, int64_t ldo,
                                const Exec& exec) {
    for (const AttentionJob& j : jobs) {
        DS_RETURN_IF_ERROR(attention(shape, j.view, q + j.first_row * ldq, ldq, j.n_q,
                                     out + j.first_row * ldo, ldo, exec));
    }
    return Status();
}
Status Backend::top_k(const float*, int64_t, int64_t, int32_t, int32_t*, float*, const Exec&) {
    return not_here(*this, "top_k");
}
Status Backend::attention_lse(const AttentionShape&, const KvView&, const float*, int64_t, int32_t,
                              float*, int64_t, float*, bool, const Exec&) {
    return not_here(*this, "attention_lse");
}
Status Backend::merge_attention(float*, float*, const float*, const float*, int, int, const Exec&) {
    return not_here(*this, "merge_attention");
}
Result<Int4DecoderRef> Backend::upload_int4_decoder(const Int4Decoder&) {
    return not_here(*this, "upload_int4_decoder");
}
Status Backend::max_head_scores(const AttentionShape&, const float*, const PoolKeys&, float*,
                                const Exec&) {
    return not_here(*this, "max_head_scores");
}
Status Backend::deltakv_encode(const LatentEncodeInputs&, const float*, int64_t,
                               const LatentEncodeOutputs&, const Exec&) {
    return not_here(*this, "deltakv_encode");
}
Status Backend::deltakv_pool_rows(const PoolRows&, float*, const Exec&) {
    return not_here(*this, "deltakv_pool_rows");
}
Status Backend::deltakv_key_scores(const AttentionShape&, const LatentRows&,
                                   const LatentDecodeInputs&, const float*, float*, int64_t,
                                   uint8_t*, const Exec&) {
    return not_here(*this, "deltakv_key_scores");
}
Status Backend::deltakv_reconstruct(const AttentionShape&, const LatentRows&,
                                    const LatentDecodeInputs&, uint8_t*, uint8_t*, size_t,
                                    const Exec&) {
    return not_here(*this, "deltakv_reconstruct");
}
Status Backend::latent_attention(const AttentionShape&, const LatentRows&, const float*,
                                 const LatentValueInputs&, float*, float*, const Exec&) {
    return not_here(*this, "latent_attention");
}

namespace {

struct Registry {
    std::mutex mu;
    // std::map keeps node addresses stable and names sorted.
    std::map<std::string, std::unique_ptr<Backend>, std::less<>> backends;
};

// A function-local static: backends register during static initialization of other
// translation units, whose order relative to this one is unspecified.
Registry& registry() {
    static Registry* r = [] {
        auto* reg = new Registry();  // never destroyed: backends outlive every static user
        reg->backends.emplace("cpu", make_cpu_backend());
        return reg;
    }();
    return *r;
}

}  // namespace

Status register_backend(std::unique_ptr<Backend> backend) {
    if (!backend) return invalid_argument("register_backend: null backend");
    std::string name(backend->name());
    Registry& reg = registry();
    std::lock_guard lock(reg.mu);
    auto [it, inserted] = reg.backends.try_emplace(name, std::move(backend));
    if (!inserted) {
        return {StatusCode::kAlreadyExists, "backend '" + name + "' is already registered"};
    }
    return Status();
}

Backend* find_backend(std::string_view name) {
    Registry& reg = registry();
    std::lock_guard lock(reg.mu);
    auto it = reg.backends.find(name);
    return it == reg.backends.end() ? nullptr : it->second.get();
}

Result<Backend*> choose_backend(std::string_view device) {
    if (device == "cpu") return find_backend("cpu");
    if (device != "" && device != "cuda") {
        return invalid_argument("--device must be cpu or cuda, not '" + std::string(device) + "'");
    }
    Backend* cuda = find_backend("cuda");
    if (cuda != nullptr && cuda->available()) {
        if (device.empty()) {  // the default: said once
            static std::once_flag said;
            std::call_once(said, [cuda] {
                spdlog::warn("running the forward pass on {} (--device cpu runs it on the CPU)",
                             cuda->description());
            });
        }
        return cuda;
    }
    if (device.empty()) return find_backend("cpu");
    if (cuda == nullptr) {
        return unavailable(
            "--device cuda: this build has no CUDA backend (built without nvcc, "
            "or with -DDELTASERVE_CUDA=OFF)");
    }
    return cuda->availability().with_context("--device cuda");
}

std::vector<std::string> backend_names() {
    Registry& reg = registry();
    std::lock_guard lock(reg.mu);
    std::vector<std::string> names;
    names.reserve(reg.backends.size());
    for (const auto& [name, backend] : reg.backends) names.push_back(name);
    return names;
}

}  // namespace deltaserve::kernels
