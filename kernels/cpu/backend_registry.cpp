// The backend registry, seeded with the CPU reference backend.
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "deltaserve/kernels/backend.h"
#include "deltaserve/kernels/ops.h"

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

Status Backend::rms_norm_rope(const RmsNormRopeParams&, const float*, const float*, const int64_t*,
                              float*) {
    return unimplemented(std::string(name()) + ": rms_norm_rope is not implemented");
}

namespace {

// The reference: the ops.h functions row by row.
class CpuBackend final : public Backend {
  public:
    std::string_view name() const override { return "cpu"; }
    bool available() const override { return true; }

    Status rms_norm_rope(const RmsNormRopeParams& p, const float* x, const float* weight,
                         const int64_t* positions, float* out) override {
        DS_RETURN_IF_ERROR(validate(p));
        for (int64_t r = 0; r < p.n_rows; ++r) {
            float* row = out + r * p.d_model;
            rms_norm(row, x + r * p.d_model, weight, p.d_model, p.eps);
            if (p.n_heads > 0) rope(row, p.n_heads, p.head_dim, positions[r], p.rope_base, p.style);
        }
        return Status();
    }
};

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
        reg->backends.emplace("cpu", std::make_unique<CpuBackend>());
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

std::vector<std::string> backend_names() {
    Registry& reg = registry();
    std::lock_guard lock(reg.mu);
    std::vector<std::string> names;
    names.reserve(reg.backends.size());
    for (const auto& [name, backend] : reg.backends) names.push_back(name);
    return names;
}

}  // namespace deltaserve::kernels
