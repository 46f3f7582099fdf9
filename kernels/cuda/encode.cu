// DeltaKV's compression on the device (encode.h): each token's nearest references and their
// mean, the encoder's residual and the latents as stored, with the CPU kernels' rounding
// (deltakv.cpp: int4_pack, write_kv_row).
#include <cuda_fp16.h>

#include <algorithm>
#include <cfloat>
#include <climits>

#include "encode.h"
#include "warp_reduce.cuh"

namespace deltaserve::kernels::cuda {

namespace {

constexpr int kNearThreads = 128;
constexpr int kMaxK = 16;
constexpr unsigned kMaxBlocks = 65535;

// (distance, ordinal) a before b: nearer, or as near and the lower ordinal.
__device__ __forceinline__ bool before(float da, int ca, float db, int cb) {
    return da < db || (da == db && ca < cb);
}

// The least (distance, ordinal) of the warp, in every lane.
__device__ __forceinline__ void warp_least(float& d, int& c) {
    for (int off = 16; off > 0; off >>= 1) {
        const float od = __shfl_xor_sync(0xffffffffu, d, off);
        const int oc = __shfl_xor_sync(0xffffffffu, c, off);
        if (before(od, oc, d, c)) {
            d = od;
            c = oc;
        }
    }
}

__global__ void nearest_refs_kernel(NearestLaunch a) {
    extern __shared__ float xs[];  // the token's row
    __shared__ float part_d[kNearThreads / 32];
    __shared__ int part_c[kNearThreads / 32];
    __shared__ int chosen[kMaxK];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int64_t i = blockIdx.x; i < a.n; i += gridDim.x) {
        const float* x = a.x + i * a.d;
        for (int t = threadIdx.x; t < a.d; t += blockDim.x) xs[t] = x[t];
        __syncthreads();
        // Each thread's k nearest of its candidates, sorted.
        float best_d[kMaxK];
        int best_c[kMaxK];
        int have = 0;
        const int n_cand = a.n_cand[i];
        for (int c = threadIdx.x; c < n_cand; c += blockDim.x) {
            const float* r = a.ref_x + static_cast<int64_t>(c) * a.d;
            float s = 0.0f;
            for (int t = 0; t < a.d; ++t) {
                const float diff = xs[t] - r[t];
                s = fmaf(diff, diff, s);
            }
            if (have == a.k && !before(s, c, best_d[have - 1], best_c[have - 1])) continue;
            int pos = have < a.k ? have++ : a.k - 1;
            for (; pos > 0 && before(s, c, best_d[pos - 1], best_c[pos - 1]); --pos) {
                best_d[pos] = best_d[pos - 1];
                best_c[pos] = best_c[pos - 1];
            }
            best_d[pos] = s;
            best_c[pos] = c;
        }
        // k rounds over the threads' heads: the least goes next, its thread moves on.
        int head = 0;
        for (int j = 0; j < a.k; ++j) {
            float d = head < have ? best_d[head] : FLT_MAX;
            int c = head < have ? best_c[head] : INT_MAX;
            warp_least(d, c);
            if (lane == 0) {
                part_d[warp] = d;
                part_c[warp] = c;
            }
            __syncthreads();
            if (warp == 0) {
                d = lane < kNearThreads / 32 ? part_d[lane] : FLT_MAX;
                c = lane < kNearThreads / 32 ? part_c[lane] : INT_MAX;
                warp_least(d, c);
                if (lane == 0) chosen[j] = c == INT_MAX ? -1 : c;
            }
            __syncthreads();
            if (head < have && best_c[head] == chosen[j]) ++head;
        }
        const int got = min(a.k, n_cand);
        for (int j = threadIdx.x; j < a.k; j += blockDim.x)
            a.refs[i * a.k + j] = j < got ? static_cast<uint16_t>(chosen[j]) : uint16_t{0xFFFF};
        // The mean, summed in the references' order as the CPU sums it.
        for (int t = threadIdx.x; t < a.d; t += blockDim.x) {
            float sum = 0.0f;
            for (int j = 0; j < got; ++j) sum += a.ref_x[static_cast<int64_t>(chosen[j]) * a.d + t];
            a.rm[i * a.d + t] = sum / static_cast<float>(max(got, 1));
        }
        __syncthreads();
    }
}

__global__ void residual_kernel(const float* e, int64_t n, int m, float* z) {
    const int64_t total = n * m;
    for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < total;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x)
        z[j] = e[j] - e[total + j];
}

__device__ __forceinline__ void put_half(uint8_t* p, float v) {
    const __half h = __float2half_rn(v);
    const unsigned short bits = __half_as_ushort(h);
    p[0] = static_cast<uint8_t>(bits & 0xFF);
    p[1] = static_cast<uint8_t>(bits >> 8);
}

// One warp per latent.
__global__ void pack_kernel(const float* z, int64_t n, int m, bool int4, uint8_t* out,
                            size_t stride) {
    const int lane = threadIdx.x % 32;
    const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32; i < n;
         i += warps) {
        const float* zi = z + i * m;
        uint8_t* row = out + static_cast<size_t>(i) * stride;
        if (!int4) {
            for (int j = lane; j < m; j += 32) put_half(row + 2 * j, zi[j]);
            continue;
        }
        float lo = zi[0], hi = zi[0];
        for (int j = lane; j < m; j += 32) {
            lo = fminf(lo, zi[j]);
            hi = fmaxf(hi, zi[j]);
        }
        lo = -warp_max(-lo);
        hi = warp_max(hi);
        // int4_pack: the minimum and the scale rounded to fp16, the codes against those.
        const __half lo16 = __float2half_rn(lo);
        const float lo_r = __half2float(lo16);
        const __half s16 = __float2half_rn(__fdiv_rn(hi - lo_r, 15.0f));
        const float s = __half2float(s16);
        const float inv = s > 0.0f ? __fdiv_rn(1.0f, s) : 0.0f;
        if (lane == 0) {
            put_half(row, __half2float(s16));
            put_half(row + 2, lo_r);
        }
        uint8_t* q = row + 4;
        for (int b = lane; b < (m + 1) / 2; b += 32) {
            int byte = 0;
            for (int h = 0; h < 2; ++h) {
                const int j = 2 * b + h;
                if (j >= m) break;
                const long v = lroundf(__fmul_rn(zi[j] - lo_r, inv));
                byte |= static_cast<int>(min(max(v, 0L), 15L)) << (4 * h);
            }
            q[b] = static_cast<uint8_t>(byte);
        }
    }
}

unsigned blocks_for(int64_t n, int64_t per_block) {
    return static_cast<unsigned>(
        std::min<int64_t>((n + per_block - 1) / per_block, static_cast<int64_t>(kMaxBlocks)));
}

}  // namespace

cudaError_t launch_nearest_refs(const NearestLaunch& a, cudaStream_t stream) {
    if (a.n == 0) return cudaSuccess;
    const size_t shared = static_cast<size_t>(a.d) * sizeof(float);
    if (shared > 48 * 1024) return cudaErrorInvalidValue;
    nearest_refs_kernel<<<blocks_for(a.n, 1), kNearThreads, shared, stream>>>(a);
    return cudaGetLastError();
}

cudaError_t launch_latent_residual(const float* e, int64_t n, int m, float* z,
                                   cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    residual_kernel<<<blocks_for(n * m, 256), 256, 0, stream>>>(e, n, m, z);
    return cudaGetLastError();
}

cudaError_t launch_pack_latents(const float* z, int64_t n, int m, bool int4, uint8_t* out,
                                size_t stride, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    pack_kernel<<<blocks_for(n, 8), 256, 0, stream>>>(z, n, m, int4, out, stride);
    return cudaGetLastError();
}

}  // namespace deltaserve::kernels::cuda
