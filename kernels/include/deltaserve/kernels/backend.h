// Compute backends behind one interface, found by name.
//
// The CPU backend ("cpu") is always registered and is the reference every other backend is
// tested against. Other backends ("cuda") register themselves from their own source file
// when their library is built and linked; find_backend() returns nullptr for a backend
// that was not built. A registered backend may still have no device: available() says so,
// and its ops then return kUnavailable.
//
// Ops a backend does not implement return kUnimplemented (the default), so callers fall
// back to the CPU.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "deltaserve/common/status.h"
#include "deltaserve/kernels/ops.h"

namespace deltaserve::kernels {

// Shape and constants of the fused RMSNorm + RoPE over a batch of rows.
// For each row r: out[r] = rms_norm(x[r], weight, eps) over d_model elements, then
// rope(out[r], n_heads, head_dim, positions[r], rope_base, style) on its first
// n_heads * head_dim elements; the rest of the row is only normalized.
struct RmsNormRopeParams {
    int64_t n_rows = 0;          // >= 0; 0 is a no-op
    int64_t d_model = 0;         // row width, > 0
    int n_heads = 0;             // heads rotated, >= 0; n_heads * head_dim <= d_model
    int head_dim = 0;            // even, in [2, 1024] when n_heads > 0
    float eps = 1e-5f;           // Default: 1e-5
    float rope_base = 10000.0f;  // Default: 10000
    RopeStyle style = RopeStyle::kInterleaved;  // Default: kInterleaved
};

// kInvalidArgument when the params break the limits above; OK otherwise.
Status validate(const RmsNormRopeParams& params);

// A compute backend. Implementations are thread-safe: ops may be called concurrently.
class Backend {
  public:
    virtual ~Backend() = default;

    // Registry key, lower case: "cpu", "cuda".
    virtual std::string_view name() const = 0;

    // True when the backend can run ops here (for "cuda": a device is present). Cheap
    // after the first call.
    virtual bool available() const = 0;

    // The fused RMSNorm + RoPE of RmsNormRopeParams. All pointers are host memory:
    // x and out hold n_rows * d_model floats (out may alias x), weight d_model floats,
    // positions n_rows values (unread when n_heads is 0). Errors: kInvalidArgument
    // (params), kUnavailable (no device), kInternal / kResourceExhausted (device failures),
    // kUnimplemented (the default for a backend without this op).
    virtual Status rms_norm_rope(const RmsNormRopeParams& params, const float* x,
                                 const float* weight, const int64_t* positions, float* out);
};

// Adds a backend to the process-wide registry. Called from a backend's own source file,
// possibly during static initialization. A second backend with the same name replaces
// nothing and is dropped (kAlreadyExists). Thread-safe.
Status register_backend(std::unique_ptr<Backend> backend);

// The backend registered under name, or nullptr when none is (not built, unknown name).
// The pointer lives until the process exits. Thread-safe.
Backend* find_backend(std::string_view name);

// Names of the registered backends, sorted.
std::vector<std::string> backend_names();

}  // namespace deltaserve::kernels
