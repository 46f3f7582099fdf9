// Attention over a slot-mapped KV view, flash-decoding style: a block of kWarps warps per
// (query, head, key split). Each warp scores kKeys keys at a time (the lanes split head_dim,
// a shuffle sums), keeps an online softmax (running max m, sum l and unnormalised output o,
// which the lanes hold kPerLane values each), and the warps merge through shared memory.
// With one split the block writes the output; with several, each writes (m, l, o) and
// attention_merge_kernel combines them, as kernels::attention merges its key ranges.
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "attention.h"
#include "warp_reduce.cuh"

namespace deltaserve::kernels::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxDim = 256;
constexpr int kPerLane = kMaxDim / 32;
constexpr int kKeys = 8;  // keys a warp scores per step
// Fewer (query, head) rows than this: the keys are split too, at least kMinSplitKeys a block.
constexpr int64_t kTargetBlocks = 1024;
constexpr int32_t kMinSplitKeys = 256;

template <bool kF16>
__device__ __forceinline__ float kv_at(const uint8_t* row, int d) {
    if constexpr (kF16) {
        return __half2float(reinterpret_cast<const __half*>(row)[d]);
    } else {
        return reinterpret_cast<const float*>(row)[d];
    }
}

// Query i and head h of a (query, head) row index.
struct RowOf {
    int32_t i;
    int h;
    __device__ RowOf(int64_t row, int n_heads)
        : i(static_cast<int32_t>(row / n_heads)),
          h(static_cast<int>(row - row / n_heads * n_heads)) {}
};

template <bool kF16>
__global__ void __launch_bounds__(kThreads) attention_kernel(AttentionLaunch a) {
    __shared__ float warp_m[kWarps];
    __shared__ float warp_l[kWarps];
    __shared__ float warp_o[kWarps][kMaxDim];
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int64_t row = blockIdx.x;
    const RowOf at(row, a.n_heads);
    const int g = at.h / (a.n_heads / a.n_kv_heads);
    const int32_t t_list = a.q_table[at.i] + g;
    const int32_t visible = a.list_n[t_list] - a.q_back[at.i];
    const int32_t lo = a.window > 0 ? max(0, visible - a.window) : 0;
    const int32_t k0 = lo + static_cast<int32_t>(blockIdx.y) * a.split_keys;
    const int32_t k1 = min(visible, k0 + a.split_keys);
    const int32_t* slots = a.slots + a.list_start[t_list];
    const size_t head_off = static_cast<size_t>(g) * a.head_stride;
    const int dim = a.head_dim;
    const int64_t q_row = a.q_row[at.i];

    const float* qh = a.q + q_row * a.ldq + static_cast<int64_t>(at.h) * dim;
    float q[kPerLane];
    float o[kPerLane];
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) {
        const int d = lane + 32 * e;
        q[e] = d < dim ? qh[d] : 0.0f;
        o[e] = 0.0f;
    }
    float m = -INFINITY;
    float l = 0.0f;
    // Uniform across the warp (t and nk), as the shuffles need.
    for (int32_t t = k0 + warp * kKeys; t < k1; t += kWarps * kKeys) {
        const int nk = min(kKeys, k1 - t);
        const uint8_t* vrow[kKeys];
        float s[kKeys];
#pragma unroll
        for (int j = 0; j < kKeys; ++j) {
            s[j] = 0.0f;
            vrow[j] = nullptr;
            if (j < nk) {
                const size_t off = static_cast<size_t>(slots[t + j]) * a.row_stride + head_off;
                const uint8_t* krow = a.k + off;
                vrow[j] = a.v + off;
#pragma unroll
                for (int e = 0; e < kPerLane; ++e) {
                    const int d = lane + 32 * e;
                    if (d < dim) s[j] = __fmaf_rn(q[e], kv_at<kF16>(krow, d), s[j]);
                }
            }
        }
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < kKeys; ++j) {
            s[j] = warp_sum(s[j]) * a.scale;
            if (j < nk) mx = fmaxf(mx, s[j]);
        }
        const float m_new = fmaxf(m, mx);
        const float corr = expf(m - m_new);  // 0 on the first step (m = -inf)
        float p[kKeys];
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < kKeys; ++j) {
            p[j] = j < nk ? expf(s[j] - m_new) : 0.0f;
            sum += p[j];
        }
        l = l * corr + sum;
        m = m_new;
#pragma unroll
        for (int e = 0; e < kPerLane; ++e) {
            const int d = lane + 32 * e;
            if (d >= dim) continue;
            float acc = o[e] * corr;
#pragma unroll
            for (int j = 0; j < kKeys; ++j) {
                if (j < nk) acc = __fmaf_rn(p[j], kv_at<kF16>(vrow[j], d), acc);
            }
            o[e] = acc;
        }
    }

    // The warps' states into one; a warp that saw no key has l = 0 and counts for nothing.
    if (lane == 0) {
        warp_m[warp] = m;
        warp_l[warp] = l;
    }
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) {
        const int d = lane + 32 * e;
        if (d < dim) warp_o[warp][d] = o[e];
    }
    __syncthreads();
    float mm = -INFINITY;
    for (int w = 0; w < kWarps; ++w) {
        if (warp_l[w] > 0.0f) mm = fmaxf(mm, warp_m[w]);
    }
    float f[kWarps];
    float ll = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
        f[w] = warp_l[w] > 0.0f ? expf(warp_m[w] - mm) : 0.0f;
        ll += warp_l[w] * f[w];
    }
    if (a.n_splits == 1) {
        float* dst = a.out + q_row * a.ldo + static_cast<int64_t>(at.h) * dim;
        const float inv = ll > 0.0f ? 1.0f / ll : 0.0f;
        if (a.lse != nullptr && threadIdx.x == 0)
            a.lse[row] = ll > 0.0f ? mm + logf(ll) : -INFINITY;
        for (int d = threadIdx.x; d < dim; d += kThreads) {
            float acc = 0.0f;
            for (int w = 0; w < kWarps; ++w) acc += warp_o[w][d] * f[w];
            dst[d] = acc * inv;
        }
        return;
    }
    float* part = a.partial + (row * a.n_splits + blockIdx.y) * (dim + 2);
    if (threadIdx.x == 0) {
        part[0] = mm;
        part[1] = ll;
    }
    for (int d = threadIdx.x; d < dim; d += kThreads) {
        float acc = 0.0f;
        for (int w = 0; w < kWarps; ++w) acc += warp_o[w][d] * f[w];
        part[2 + d] = acc;
    }
}

// One block per (query, head) row: its splits' (m, l, o) into the normalised output.
__global__ void __launch_bounds__(kThreads) attention_merge_kernel(AttentionLaunch a) {
    const int64_t row = blockIdx.x;
    const RowOf at(row, a.n_heads);
    const int dim = a.head_dim;
    const int stride = dim + 2;
    const float* part = a.partial + row * a.n_splits * stride;
    float mm = -INFINITY;
    for (int s = 0; s < a.n_splits; ++s) {
        if (part[s * stride + 1] > 0.0f) mm = fmaxf(mm, part[s * stride]);
    }
    float ll = 0.0f;
    for (int s = 0; s < a.n_splits; ++s) {
        const float l = part[s * stride + 1];
        if (l > 0.0f) ll += l * expf(part[s * stride] - mm);
    }
    const float inv = ll > 0.0f ? 1.0f / ll : 0.0f;
    if (a.lse != nullptr && threadIdx.x == 0) a.lse[row] = ll > 0.0f ? mm + logf(ll) : -INFINITY;
    float* dst = a.out + a.q_row[at.i] * a.ldo + static_cast<int64_t>(at.h) * dim;
    for (int d = threadIdx.x; d < dim; d += kThreads) {
        float acc = 0.0f;
        for (int s = 0; s < a.n_splits; ++s) {
            const float* p = part + s * stride;
            if (p[1] > 0.0f) acc += p[2 + d] * expf(p[0] - mm);
        }
        dst[d] = acc * inv;
    }
}

}  // namespace

AttentionPlan attention_plan(int32_t n_q, int n_heads, int head_dim, int32_t max_n) {
    AttentionPlan plan;
    plan.split_keys = std::max(max_n, 1);
    const int64_t rows = static_cast<int64_t>(n_q) * n_heads;
    if (rows == 0 || rows >= kTargetBlocks || max_n <= kMinSplitKeys) return plan;
    const int64_t by_keys = (max_n + kMinSplitKeys - 1) / kMinSplitKeys;
    const int64_t by_blocks = (kTargetBlocks + rows - 1) / rows;
    plan.n_splits = static_cast<int>(std::min(by_keys, by_blocks));
    if (plan.n_splits == 1) return plan;
    plan.split_keys = (max_n + plan.n_splits - 1) / plan.n_splits;
    plan.partial_bytes = static_cast<size_t>(rows) * plan.n_splits * (head_dim + 2) * sizeof(float);
    return plan;
}

cudaError_t launch_attention(const AttentionLaunch& args, cudaStream_t stream) {
    const int64_t rows = static_cast<int64_t>(args.n_q) * args.n_heads;
    if (rows == 0) return cudaSuccess;
    const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(args.n_splits));
    if (args.f16) {
        attention_kernel<true><<<grid, kThreads, 0, stream>>>(args);
    } else {
        attention_kernel<false><<<grid, kThreads, 0, stream>>>(args);
    }
    if (args.n_splits > 1) {
        const cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess) return err;
        attention_merge_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(args);
    }
    return cudaGetLastError();
}

}  // namespace deltaserve::kernels::cuda
