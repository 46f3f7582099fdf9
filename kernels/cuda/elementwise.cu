// Row and elementwise ops of the forward pass. Each mirrors its CPU reference
// (kernels/cpu/ops.cpp, quant.cpp) with explicitly rounded intrinsics where the reference
// rounds each step, so the results differ from it in the last bits at most.
#include <algorithm>

#include "elementwise.h"
#include "rope_table.cuh"
#include "warp_reduce.cuh"
#include "weight_blocks.cuh"

namespace deltaserve::kernels::cuda {
namespace {

constexpr int kRowThreads = 256;  // one block per row
constexpr int kRowWarps = kRowThreads / 32;
constexpr int kFlatThreads = 256;
constexpr int64_t kMaxFlatBlocks = 1 << 16;  // grid-stride beyond this

// As kernels::rms_norm: the squares rounded in float and summed in double (here a tree),
// scale = 1 / sqrt(float(mean) + eps), out = x * scale * w. x and out may alias: all of x
// is read before the barrier, and afterwards each thread touches only its own elements.
__global__ void __launch_bounds__(kRowThreads)
    rms_norm_rows_kernel(const float* x, int64_t ldx, const float* w, int64_t d, float eps,
                         float* out, int64_t ldo) {
    __shared__ double warp_sums[kRowWarps];
    x += static_cast<int64_t>(blockIdx.x) * ldx;
    out += static_cast<int64_t>(blockIdx.x) * ldo;
    double ss = 0.0;
    for (int64_t i = threadIdx.x; i < d; i += kRowThreads) {
        ss += static_cast<double>(__fmul_rn(x[i], x[i]));
    }
    ss = warp_sum(ss);
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = ss;
    __syncthreads();
    ss = 0.0;
    for (int i = 0; i < kRowWarps; ++i) ss += warp_sums[i];
    const float mean = static_cast<float>(ss / static_cast<double>(d));
    const float scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
    for (int64_t i = threadIdx.x; i < d; i += kRowThreads) {
        out[i] = __fmul_rn(__fmul_rn(x[i], scale), w[i]);
    }
}

__global__ void __launch_bounds__(kRowThreads) rope_rows_kernel(RopeRowsLaunch a) {
    extern __shared__ float trig[];  // cos[half], then sin[half]
    const int half = a.head_dim / 2;
    float* cos_t = trig;
    float* sin_t = trig + half;
    rope_table(static_cast<float>(a.positions[blockIdx.x]), a.theta_scale, half, cos_t, sin_t,
               a.freq_factors, a.freq_scale);
    __syncthreads();
    float* x = a.x + static_cast<int64_t>(blockIdx.x) * a.ldx;
    const int n_pairs = a.n_heads * half;
    for (int p = threadIdx.x; p < n_pairs; p += kRowThreads) {
        const int h = p / half;
        const int j = p - h * half;
        float* v = x + static_cast<int64_t>(h) * a.head_dim;
        const int i0 = a.interleaved ? 2 * j : j;
        const int i1 = a.interleaved ? 2 * j + 1 : j + half;
        const float v0 = v[i0];
        const float v1 = v[i1];
        v[i0] = __fsub_rn(__fmul_rn(v0, cos_t[j]), __fmul_rn(v1, sin_t[j]));
        v[i1] = __fadd_rn(__fmul_rn(v0, sin_t[j]), __fmul_rn(v1, cos_t[j]));
    }
}

// expf is the accurate one (no fast math here); the CPU's is a ~1.5 ulp polynomial.
__global__ void silu_mul_kernel(float* out, const float* gate, const float* up, int64_t n) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        const float g = gate[i];
        out[i] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), up[i]);
    }
}

// tanhf is the accurate one, as the CPU's std::tanh.
__global__ void gelu_mul_kernel(float* out, const float* gate, const float* up, int64_t n) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        const float g = gate[i];
        const float inner = __fmul_rn(__fmul_rn(0.79788456080286535587989211986876f, g),
                                      __fadd_rn(1.0f, __fmul_rn(__fmul_rn(0.044715f, g), g)));
        out[i] = __fmul_rn(__fmul_rn(__fmul_rn(0.5f, g), __fadd_rn(1.0f, tanhf(inner))), up[i]);
    }
}

__global__ void scale_kernel(float* x, float s, int64_t n) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        x[i] = __fmul_rn(x[i], s);
    }
}

__global__ void add_kernel(float* y, const float* x, int64_t n) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        y[i] = __fadd_rn(y[i], x[i]);
    }
}

template <DType T>
__global__ void __launch_bounds__(kRowThreads)
    embed_rows_kernel(const uint8_t* table, size_t row_stride, int64_t cols, const int32_t* tokens,
                      float* out) {
    const uint8_t* row = table + static_cast<size_t>(tokens[blockIdx.x]) * row_stride;
    out += static_cast<int64_t>(blockIdx.x) * cols;
    for (int64_t c = threadIdx.x; c < cols; c += kRowThreads) out[c] = weight_value<T>(row, c);
}

unsigned flat_blocks(int64_t n) {
    return static_cast<unsigned>(
        std::min<int64_t>((n + kFlatThreads - 1) / kFlatThreads, kMaxFlatBlocks));
}

}  // namespace

cudaError_t launch_rms_norm_rows(const float* x, int64_t ldx, const float* weight, int64_t d,
                                 int64_t n, float eps, float* out, int64_t ldo,
                                 cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    rms_norm_rows_kernel<<<static_cast<unsigned>(n), kRowThreads, 0, stream>>>(x, ldx, weight, d,
                                                                               eps, out, ldo);
    return cudaGetLastError();
}

cudaError_t launch_rope_rows(const RopeRowsLaunch& args, cudaStream_t stream) {
    if (args.n == 0 || args.n_heads == 0) return cudaSuccess;
    const size_t shared_bytes = static_cast<size_t>(args.head_dim) * sizeof(float);
    rope_rows_kernel<<<static_cast<unsigned>(args.n), kRowThreads, shared_bytes, stream>>>(args);
    return cudaGetLastError();
}

cudaError_t launch_silu_mul(float* out, const float* gate, const float* up, int64_t n,
                            cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    silu_mul_kernel<<<flat_blocks(n), kFlatThreads, 0, stream>>>(out, gate, up, n);
    return cudaGetLastError();
}

cudaError_t launch_add(float* y, const float* x, int64_t n, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    add_kernel<<<flat_blocks(n), kFlatThreads, 0, stream>>>(y, x, n);
    return cudaGetLastError();
}

cudaError_t launch_gelu_mul(float* out, const float* gate, const float* up, int64_t n,
                            cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    gelu_mul_kernel<<<flat_blocks(n), kFlatThreads, 0, stream>>>(out, gate, up, n);
    return cudaGetLastError();
}

cudaError_t launch_scale(float* x, float s, int64_t n, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    scale_kernel<<<flat_blocks(n), kFlatThreads, 0, stream>>>(x, s, n);
    return cudaGetLastError();
}

cudaError_t launch_embed_rows(DType type, const void* table, size_t row_stride, int64_t cols,
                              const int32_t* tokens, int64_t n, float* out, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    const auto* t = static_cast<const uint8_t*>(table);
    const bool known = with_weight_type(type, [&](auto tag) {
        embed_rows_kernel<decltype(tag)::value>
            <<<static_cast<unsigned>(n), kRowThreads, 0, stream>>>(t, row_stride, cols, tokens,
                                                                   out);
    });
    if (!known) return cudaErrorInvalidValue;
    return cudaGetLastError();
}

}  // namespace deltaserve::kernels::cuda
