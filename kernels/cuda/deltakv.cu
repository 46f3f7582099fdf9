// DeltaKV's decode step on the device (deltakv.h): reference rows back before RoPE, latent
// keys decoded and scored in one block per token, and attention through the latents
// (kernels::latent_attention's math: Dec is linear, so the weighted latents of a head go
// through the decoder once, and each token's references get its weight's share).
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "deltakv.h"
#include "warp_reduce.cuh"

namespace deltaserve::kernels::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxWidth = 2048;  // n_kv_heads * head_dim (deltakv_ops.h checks it)
constexpr int kMaxCodes = 512;   // int4_code_stride(kMaxLatent)
constexpr int kMaxRefs = 16;
constexpr uint16_t kNoRef = 0xFFFF;

__device__ __forceinline__ float half_at(const uint8_t* p) {
    const unsigned short bits = static_cast<unsigned short>(p[0] | (p[1] << 8));
    return __half2float(__ushort_as_half(bits));
}

// Pair p of the first n_heads heads: its two values, and its angle's index.
__device__ __forceinline__ void pair_of(int p, const AnglesLaunch& a, int* i0, int* i1, int* j) {
    const int half = a.head_dim / 2;
    const int h = p / half;
    *j = p - h * half;
    *i0 = h * a.head_dim + (a.interleaved ? 2 * *j : *j);
    *i1 = *i0 + (a.interleaved ? 1 : half);
}

// (x0, x1) turned by the angle (rope_apply's arithmetic; the inverse negates the sine).
__device__ __forceinline__ void turn(float* x0, float* x1, float c, float s, bool inverse) {
    const float sn = inverse ? -s : s;
    const float a = *x0, b = *x1;
    *x0 = __fmaf_rn(b, -sn, a * c);
    *x1 = __fmaf_rn(a, sn, b * c);
}

// A warp per row: each head's q . k summed across the lanes, the max kept.
__global__ void __launch_bounds__(kThreads) head_scores_kernel(HeadScoresLaunch a) {
    const int lane = threadIdx.x % 32;
    const int group = a.n_heads / a.n_kv_heads;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; i < a.n;
         i += static_cast<int64_t>(gridDim.x) * kWarps) {
        const uint8_t* row = a.k + static_cast<size_t>(a.slots[i]) * a.row_stride;
        float best = -INFINITY;
        for (int h = 0; h < a.n_heads; ++h) {
            const float* q = a.q + static_cast<int64_t>(h) * a.head_dim;
            const uint8_t* k = row + 2 * static_cast<size_t>(h / group) * a.head_dim;
            float dot = 0.0f;
            for (int j = lane; j < a.head_dim; j += 32)
                dot = __fmaf_rn(q[j], half_at(k + 2 * j), dot);
            best = fmaxf(best, warp_sum(dot));
        }
        if (lane == 0) a.scores[i] = best;
    }
}

__global__ void __launch_bounds__(kThreads) pool_rows_kernel(PoolRowsLaunch a) {
    const int64_t i = blockIdx.x;
    const size_t at = static_cast<size_t>(a.slots[i]) * a.row_stride;
    const int dims = a.v != nullptr ? 2 * a.width : a.width;
    float* x = a.out + i * dims;
    const int rope_dims = a.angles.n_heads * a.angles.head_dim;
    for (int e = threadIdx.x; e < a.width; e += kThreads) {
        if (e >= rope_dims) x[e] = half_at(a.k + at + 2 * e);
        if (a.v != nullptr) x[a.width + e] = half_at(a.v + at + 2 * e);
    }
    const float* c = a.angles.table + a.angles.at[i];
    const int half = a.angles.head_dim / 2;
    for (int p = threadIdx.x; p < rope_dims / 2; p += kThreads) {
        int i0, i1, j;
        pair_of(p, a.angles, &i0, &i1, &j);
        float x0 = half_at(a.k + at + 2 * i0), x1 = half_at(a.k + at + 2 * i1);
        turn(&x0, &x1, c[j], c[half + j], true);
        x[i0] = x0;
        x[i1] = x1;
    }
}

// Token i's row made in y (shared, src.rows floats) by the whole block: Dec of its int4
// codes (kept in codes_out when given), plus the mean of its references' rows, then RoPE on
// the first heads. y is complete when it returns.
__device__ void make_row(const LatentsLaunch& lat, int64_t i, const RowSource& src,
                         uint8_t* codes_out, float* y) {
    __shared__ __align__(4) uint8_t code[kMaxCodes];
    __shared__ const float* refs[kMaxRefs];
    __shared__ int n_refs;
    const int32_t row = lat.rows[i];
    const uint8_t* packed = lat.latents + static_cast<size_t>(row) * lat.stride;
    for (int j = threadIdx.x; j < lat.m16; j += kThreads) {
        const uint8_t c = j < lat.m ? (packed[4 + j / 2] >> (4 * (j & 1))) & 15 : 0;
        code[j] = c;
        if (codes_out != nullptr) codes_out[i * lat.m16 + j] = c;
    }
    if (threadIdx.x == 0) {
        int nr = 0;
        for (int q = 0; q < lat.k; ++q) {
            const uint16_t o = lat.refs[static_cast<size_t>(row) * lat.k + q];
            if (o != kNoRef) refs[nr++] = src.ref_x + static_cast<size_t>(o) * src.rows;
        }
        n_refs = nr;
    }
    __syncthreads();
    const float s = half_at(packed), lo = half_at(packed + 2);
    const float inv = n_refs > 0 ? 1.0f / static_cast<float>(n_refs) : 0.0f;
    const int* w4 = reinterpret_cast<const int*>(src.dec_w);
    const int* c4 = reinterpret_cast<const int*>(code);
    for (int r = threadIdx.x; r < src.rows; r += kThreads) {
        int acc = 0;
        for (int j4 = 0; j4 < lat.m16 / 4; ++j4) acc = __dp4a(w4[j4 * src.rows + r], c4[j4], acc);
        float v = __fmaf_rn(s * src.dec_scale[r], static_cast<float>(acc), lo * src.dec_row_sum[r]);
        if (n_refs > 0) {
            float sum = refs[0][r];
            for (int q = 1; q < n_refs; ++q) sum += refs[q][r];
            v = __fmaf_rn(sum, inv, v);
        }
        y[r] = v;
    }
    __syncthreads();
    const float* c = src.angles.table + src.angles.at[i];
    const int half = src.angles.head_dim / 2;
    for (int p = threadIdx.x; p < src.angles.n_heads * half; p += kThreads) {
        int i0, i1, j;
        pair_of(p, src.angles, &i0, &i1, &j);
        turn(&y[i0], &y[i1], c[j], c[half + j], false);
    }
    __syncthreads();
}

__global__ void __launch_bounds__(kThreads) key_scores_kernel(KeyScoresLaunch a) {
    __shared__ float y[kMaxWidth];
    const int64_t i = blockIdx.x;
    make_row(a.lat, i, a.src, a.codes, y);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int group = a.n_heads / a.n_kv_heads;
    for (int h = warp; h < a.n_heads; h += kWarps) {
        const float* qh = a.q + static_cast<int64_t>(h) * a.head_dim;
        const float* kg = y + (h / group) * a.head_dim;
        float acc = 0.0f;
        for (int d = lane; d < a.head_dim; d += 32) acc = __fmaf_rn(qh[d], kg[d], acc);
        acc = warp_sum(acc);
        if (lane == 0) a.scores[h * a.lds + i] = acc * a.scale;
    }
}

__global__ void __launch_bounds__(kThreads) reconstruct_kernel(ReconstructLaunch a) {
    __shared__ float y[2 * kMaxWidth];
    const int64_t i = blockIdx.x;
    make_row(a.lat, i, a.src, nullptr, y);
    const int width = a.src.rows / 2;
    __half* k = reinterpret_cast<__half*>(a.k_out + i * a.out_stride);
    __half* v = reinterpret_cast<__half*>(a.v_out + i * a.out_stride);
    for (int e = threadIdx.x; e < width; e += kThreads) {
        k[e] = __float2half_rn(y[e]);
        v[e] = __float2half_rn(y[width + e]);
    }
}

// A block-wide reduction of one value per thread (max or sum), every thread getting it.
template <bool kMax>
__device__ float block_reduce(float v, float* shared) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    v = kMax ? warp_max(v) : warp_sum(v);
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    float r = shared[0];
    for (int w = 1; w < kWarps; ++w) r = kMax ? fmaxf(r, shared[w]) : r + shared[w];
    __syncthreads();
    return r;
}

// Per head: the scores' max and the sum of exp(score - max).
__global__ void __launch_bounds__(kThreads) latent_stats_kernel(LatentAttentionLaunch a) {
    __shared__ float red[kWarps];
    const int h = blockIdx.x;
    const int64_t n = a.lat.n;
    const float* sh = a.scores + h * n;
    float mx = -INFINITY;
    for (int64_t i = threadIdx.x; i < n; i += kThreads) mx = fmaxf(mx, sh[i]);
    mx = block_reduce<true>(mx, red);
    float l = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += kThreads) l += expf(sh[i] - mx);
    l = block_reduce<false>(l, red);
    if (threadIdx.x == 0) {
        a.head_stats[h] = mx;
        a.head_stats[a.n_heads + h] = l;
    }
}

// Per (head, piece of tokens): m weighted latent columns, head_dim weighted reference V
// values, and the piece's sum of p * lo (int4), into the piece's partial row.
__global__ void __launch_bounds__(kThreads) latent_partial_kernel(LatentAttentionLaunch a) {
    __shared__ float p_sh[kLatentPiece], ps_sh[kLatentPiece], lo_sh[kLatentPiece],
        share_sh[kLatentPiece];
    __shared__ uint16_t ref_sh[kLatentPiece * kMaxRefs];
    __shared__ int nr_sh[kLatentPiece];
    const LatentsLaunch& lat = a.lat;
    const int h = blockIdx.x;
    const int64_t piece = blockIdx.y;
    const int64_t i0 = piece * kLatentPiece;
    const int nt = static_cast<int>(min(kLatentPiece, lat.n - i0));
    const float mx = a.head_stats[h];
    for (int t = threadIdx.x; t < nt; t += kThreads) {
        const int64_t i = i0 + t;
        const float p = expf(a.scores[h * lat.n + i] - mx);
        const int32_t row = lat.rows[i];
        const uint8_t* packed = lat.latents + static_cast<size_t>(row) * lat.stride;
        p_sh[t] = p;
        if (lat.int4) {
            ps_sh[t] = p * half_at(packed);
            lo_sh[t] = p * half_at(packed + 2);
        }
        int nr = 0;
        for (int q = 0; q < lat.k; ++q) {
            const uint16_t o = lat.refs[static_cast<size_t>(row) * lat.k + q];
            if (o != kNoRef) ref_sh[t * kMaxRefs + nr++] = o;
        }
        nr_sh[t] = nr;
        share_sh[t] = nr > 0 ? p / static_cast<float>(nr) : 0.0f;
    }
    __syncthreads();
    const int m = lat.m, dim = a.head_dim;
    const int g = h / (a.n_heads / a.n_kv_heads);
    float* part = a.partial + (h * gridDim.y + piece) * (m + dim + 1);
    for (int col = threadIdx.x; col < m + dim + 1; col += kThreads) {
        float acc = 0.0f;
        if (col < m) {
            for (int t = 0; t < nt; ++t) {
                const int64_t i = i0 + t;
                float z;
                if (!lat.int4) {
                    z = half_at(lat.latents + static_cast<size_t>(lat.rows[i]) * lat.stride +
                                2 * col);
                    acc = __fmaf_rn(p_sh[t], z, acc);
                } else {
                    const uint8_t c =
                        a.codes != nullptr
                            ? a.codes[i * lat.m16 + col]
                            : (lat.latents[static_cast<size_t>(lat.rows[i]) * lat.stride + 4 +
                                           col / 2] >>
                               (4 * (col & 1))) &
                                  15;
                    acc = __fmaf_rn(ps_sh[t], static_cast<float>(c), acc);
                }
            }
        } else if (col < m + dim) {
            const int d = g * dim + (col - m);
            for (int t = 0; t < nt; ++t) {
                float sum = 0.0f;
                for (int q = 0; q < nr_sh[t]; ++q) {
                    sum += half_at(a.ref_v +
                                   static_cast<size_t>(a.ref_slots[ref_sh[t * kMaxRefs + q]]) *
                                       a.ref_stride +
                                   2 * d);
                }
                acc = __fmaf_rn(share_sh[t], sum, acc);
            }
        } else if (lat.int4) {  // the piece's sum of p * lo, added to every latent column
            for (int t = 0; t < nt; ++t) acc += lo_sh[t];
        }
        part[col] = acc;
    }
}

// Per head: the pieces in order, Dec_v's rows of the head's KV head, and the normalised
// output and lse.
__global__ void __launch_bounds__(kThreads)
    latent_finish_kernel(LatentAttentionLaunch a, int pieces) {
    __shared__ float zsum[kMaxCodes];
    const int h = blockIdx.x;
    const int m = a.lat.m, dim = a.head_dim, stride = m + dim + 1;
    const float* part = a.partial + static_cast<int64_t>(h) * pieces * stride;
    for (int j = threadIdx.x; j < m; j += kThreads) {
        float acc = 0.0f;
        for (int b = 0; b < pieces; ++b) acc += part[b * stride + j] + part[b * stride + m + dim];
        zsum[j] = acc;
    }
    __syncthreads();
    const float mx = a.head_stats[h], l = a.head_stats[a.n_heads + h];
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    const int g = h / (a.n_heads / a.n_kv_heads);
    for (int d = threadIdx.x; d < dim; d += kThreads) {
        const float* wr = a.wd_v + static_cast<int64_t>(g * dim + d) * m;
        float o = 0.0f;
        for (int j = 0; j < m; ++j) o = __fmaf_rn(wr[j], zsum[j], o);
        for (int b = 0; b < pieces; ++b) o += part[b * stride + m + d];
        a.out[h * dim + d] = o * inv;
    }
    if (threadIdx.x == 0) a.lse[h] = l > 0.0f ? mx + logf(l) : -INFINITY;
}

__global__ void __launch_bounds__(kThreads)
    merge_kernel(float* out, float* lse, const float* out_b, const float* lse_b, int head_dim) {
    const int r = blockIdx.x;
    const float la = lse[r], lb = lse_b[r];
    const float m = fmaxf(la, lb);
    if (m == -INFINITY) return;  // both empty
    const float wa = expf(la - m), wb = expf(lb - m);
    const float inv = 1.0f / (wa + wb);
    float* o = out + static_cast<int64_t>(r) * head_dim;
    const float* ob = out_b + static_cast<int64_t>(r) * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += kThreads) o[d] = (o[d] * wa + ob[d] * wb) * inv;
    __syncthreads();  // every thread has read lse[r]
    if (threadIdx.x == 0) lse[r] = m + logf(wa + wb);
}

}  // namespace

cudaError_t launch_max_head_scores(const HeadScoresLaunch& a, cudaStream_t stream) {
    if (a.n == 0) return cudaSuccess;
    const int64_t blocks = std::min<int64_t>((a.n + kWarps - 1) / kWarps, 65535);
    head_scores_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(a);
    return cudaGetLastError();
}

cudaError_t launch_pool_rows(const PoolRowsLaunch& a, cudaStream_t stream) {
    if (a.n == 0) return cudaSuccess;
    pool_rows_kernel<<<static_cast<unsigned>(a.n), kThreads, 0, stream>>>(a);
    return cudaGetLastError();
}

cudaError_t launch_key_scores(const KeyScoresLaunch& a, cudaStream_t stream) {
    if (a.lat.n == 0) return cudaSuccess;
    key_scores_kernel<<<static_cast<unsigned>(a.lat.n), kThreads, 0, stream>>>(a);
    return cudaGetLastError();
}

cudaError_t launch_reconstruct(const ReconstructLaunch& a, cudaStream_t stream) {
    if (a.lat.n == 0) return cudaSuccess;
    reconstruct_kernel<<<static_cast<unsigned>(a.lat.n), kThreads, 0, stream>>>(a);
    return cudaGetLastError();
}

cudaError_t launch_latent_attention(const LatentAttentionLaunch& a, cudaStream_t stream) {
    latent_stats_kernel<<<a.n_heads, kThreads, 0, stream>>>(a);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    const int64_t pieces = latent_pieces(a.lat.n);
    if (pieces > 0) {
        const dim3 grid(static_cast<unsigned>(a.n_heads), static_cast<unsigned>(pieces));
        latent_partial_kernel<<<grid, kThreads, 0, stream>>>(a);
        err = cudaGetLastError();
        if (err != cudaSuccess) return err;
    }
    latent_finish_kernel<<<a.n_heads, kThreads, 0, stream>>>(a, static_cast<int>(pieces));
    return cudaGetLastError();
}

cudaError_t launch_merge_attention(float* out, float* lse, const float* out_b, const float* lse_b,
                                   int n_rows, int head_dim, cudaStream_t stream) {
    if (n_rows == 0) return cudaSuccess;
    merge_kernel<<<n_rows, kThreads, 0, stream>>>(out, lse, out_b, lse_b, head_dim);
    return cudaGetLastError();
}

}  // namespace deltaserve::kernels::cuda
