// Fused RMSNorm + RoPE: one thread block per row.
//
// Parity with the CPU reference (kernels/cpu/ops.cpp) is the point of this kernel, so the
// arithmetic mirrors it step for step with explicitly rounded intrinsics (no FMA
// contraction): the same scale = 1 / sqrt(mean(x^2) + eps), the same (x * scale) * w, and
// the same angles (rope_table.cuh). Only the order of the sum of squares differs (a tree
// here).
#include "rms_norm_rope.h"
#include "rope_table.cuh"

namespace deltaserve::kernels::cuda {
namespace {

constexpr int kThreads = 256;  // a multiple of 32; rows narrower than this leave threads idle
constexpr int kWarps = kThreads / 32;

// Sum of v over the block, returned to every thread. Contains __syncthreads().
__device__ float block_sum(float v) {
    __shared__ float warp_sums[kWarps];
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    v = lane < kWarps ? warp_sums[lane] : 0.0f;
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

__device__ __forceinline__ float normed(const float* x, const float* w, int64_t i, float scale) {
    return __fmul_rn(__fmul_rn(x[i], scale), w[i]);
}

// x and out may alias: every thread reads x for the sum of squares before the barrier in
// block_sum, and afterwards reads and writes only the elements it owns.
__global__ void __launch_bounds__(kThreads) rms_norm_rope_kernel(RmsNormRopeLaunch a) {
    extern __shared__ float trig[];  // cos[half], then sin[half]
    const int64_t d = a.d_model;
    const float* x = a.x + static_cast<int64_t>(blockIdx.x) * d;
    float* out = a.out + static_cast<int64_t>(blockIdx.x) * d;

    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < d; i += kThreads) ss = __fadd_rn(ss, __fmul_rn(x[i], x[i]));
    ss = block_sum(ss);
    const float scale =
        __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, static_cast<float>(d)), a.eps)));

    const int half = a.head_dim / 2;
    float* cos_t = trig;
    float* sin_t = trig + half;
    if (a.n_heads > 0) {
        rope_table(static_cast<float>(a.positions[blockIdx.x]), a.theta_scale, half, cos_t, sin_t);
        __syncthreads();
    }

    const int64_t n_pairs = static_cast<int64_t>(a.n_heads) * half;
    for (int64_t p = threadIdx.x; p < n_pairs; p += kThreads) {
        const int64_t h = p / half;
        const int j = static_cast<int>(p - h * half);
        const int64_t head = h * a.head_dim;
        const int64_t i0 = head + (a.interleaved ? 2 * j : j);
        const int64_t i1 = head + (a.interleaved ? 2 * j + 1 : j + half);
        const float v0 = normed(x, a.weight, i0, scale);
        const float v1 = normed(x, a.weight, i1, scale);
        out[i0] = __fsub_rn(__fmul_rn(v0, cos_t[j]), __fmul_rn(v1, sin_t[j]));
        out[i1] = __fadd_rn(__fmul_rn(v0, sin_t[j]), __fmul_rn(v1, cos_t[j]));
    }
    for (int64_t i = 2 * n_pairs + threadIdx.x; i < d; i += kThreads) {
        out[i] = normed(x, a.weight, i, scale);
    }
}

}  // namespace

cudaError_t launch_rms_norm_rope(const RmsNormRopeLaunch& args, cudaStream_t stream) {
    if (args.n_rows == 0) return cudaSuccess;
    if (args.n_rows < 0 || args.n_rows > 0x7fffffff) return cudaErrorInvalidValue;
    const size_t shared_bytes = 2 * static_cast<size_t>(args.head_dim / 2) * sizeof(float);
    rms_norm_rope_kernel<<<static_cast<unsigned>(args.n_rows), kThreads, shared_bytes, stream>>>(
        args);
    return cudaGetLastError();
}

}  // namespace deltaserve::kernels::cuda
