// top_k: one block per row, k rounds of a block-wide argmax. Each thread owns the ids
// tid, tid + kThreads, ... and keeps the first of them (in the order: larger key, then lower
// id) that comes after the last pick. A round takes the first of the threads' candidates;
// only the thread that owned the pick looks for its next one, since every other thread's
// candidate is still the first of its own ids after the new pick. So a row is read once,
// plus n_vocab / kThreads per round.
#include <cmath>

#include "top_k.h"

namespace deltaserve::kernels::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;

// A candidate: its key (NaN as -inf) and id; id -1 is none.
struct Pick {
    float key;
    int32_t id;
};

__device__ __forceinline__ float key_of(float v) { return isnan(v) ? -INFINITY : v; }

// Whether a comes before b: the larger key, then the lower id.
__device__ __forceinline__ bool before(Pick a, Pick b) {
    return a.key != b.key ? a.key > b.key : a.id < b.id;
}

// The first of two candidates, either of which may be none.
__device__ __forceinline__ Pick first_of(Pick a, Pick b) {
    if (a.id < 0) return b;
    if (b.id < 0) return a;
    return before(b, a) ? b : a;
}

// The first of this thread's ids that comes after `last`.
__device__ Pick first_after(const float* row, int32_t n, Pick last) {
    Pick best{-INFINITY, -1};
    for (int32_t c = threadIdx.x; c < n; c += kThreads) {
        const Pick p{key_of(row[c]), c};
        if (before(last, p)) best = first_of(best, p);
    }
    return best;
}

__device__ __forceinline__ Pick first_of_warp(Pick p) {
    for (int off = 16; off > 0; off >>= 1) {
        p = first_of(p, Pick{__shfl_xor_sync(0xffffffffu, p.key, off),
                             __shfl_xor_sync(0xffffffffu, p.id, off)});
    }
    return p;
}

__global__ void __launch_bounds__(kThreads)
    top_k_kernel(const float* logits, int32_t n_vocab, int32_t k, int32_t* ids, float* values) {
    __shared__ Pick warp_first[kWarps];
    __shared__ Pick picked;
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;
    const float* row = logits + static_cast<int64_t>(blockIdx.x) * n_vocab;
    ids += static_cast<int64_t>(blockIdx.x) * k;
    values += static_cast<int64_t>(blockIdx.x) * k;
    // Every id comes after (+inf, -1) under `before`: a smaller key, or +inf and a higher id.
    Pick mine = first_after(row, n_vocab, Pick{INFINITY, -1});
    for (int32_t j = 0; j < k; ++j) {
        const Pick w = first_of_warp(mine);
        if (lane == 0) warp_first[warp] = w;
        __syncthreads();
        if (warp == 0) {
            const Pick p = first_of_warp(warp_first[lane]);
            if (lane == 0) {
                picked = p;
                ids[j] = p.id;
                values[j] = row[p.id];
            }
        }
        __syncthreads();
        const Pick p = picked;
        if (p.id % kThreads == static_cast<int32_t>(threadIdx.x))
            mine = first_after(row, n_vocab, p);
    }
}

}  // namespace

cudaError_t launch_top_k(const float* logits, int64_t n_vocab, int64_t n_rows, int32_t k,
                         int32_t* ids, float* values, cudaStream_t stream) {
    if (n_rows == 0) return cudaSuccess;
    top_k_kernel<<<static_cast<unsigned>(n_rows), kThreads, 0, stream>>>(
        logits, static_cast<int32_t>(n_vocab), k, ids, values);
    return cudaGetLastError();
}

}  // namespace deltaserve::kernels::cuda
