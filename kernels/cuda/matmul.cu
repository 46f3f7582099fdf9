// Matmuls against row-major weights: one warp per output row, its lanes striding over the
// row (a block of 32 or an element each), up to kTokens tokens per pass so that a weight
// loaded once serves them all, then a warp-shuffle sum.
//
// Q4_0, Q4_1 and Q8_0 run as kernels::matmul does on the CPU (DotOrder::kBlock): the
// activations quantized to int8 blocks with the CPU's rounding, each block's products summed
// exactly in integers (dp4a), then acc += float(sum) * (d_w * d_x) and, for Q4, the offset
// term m_w * s_x in a second accumulator. The results differ from the CPU's only in the order
// the blocks are added. The float types multiply fp32 activations in fp32, and so, for now,
// do Q5_0, Q5_1, IQ4_NL, the K-quants and IQ4_XS: each weight dequantized as the CPU's
// dequantize_row (weight_value), without the CPU's int8 activations, so their results
// differ from the CPU's by its activations' rounding (NMSE ~5e-5).
#include <algorithm>

#include "matmul.h"
#include "warp_reduce.cuh"
#include "weight_blocks.cuh"

namespace deltaserve::kernels::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;           // one output row each
constexpr int kTokens = 8;                  // tokens per pass over a row
constexpr int64_t kMaxTokenPasses = 65535;  // gridDim.y; the kernels loop beyond it
constexpr int kQuantThreads = 256;
constexpr int64_t kMaxQuantBlocks = 1 << 16;

__device__ __forceinline__ float fp16_round(float x) { return __half2float(__float2half_rn(x)); }

// One warp per block of 32 values: the lanes hold its elements.
__global__ void __launch_bounds__(kQuantThreads)
    quantize_activations_kernel(const float* x, int64_t ldx, int64_t n, int64_t nb, BlockQ8A* out) {
    const int lane = threadIdx.x % 32;
    const int64_t warps = static_cast<int64_t>(gridDim.x) * (kQuantThreads / 32);
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * (kQuantThreads / 32) + threadIdx.x / 32;
         i < n * nb; i += warps) {
        const int64_t t = i / nb;
        const float v = x[t * ldx + (i - t * nb) * kQK + lane];
        const float amax = warp_max(fabsf(v));
        const float d = __fdiv_rn(amax, 127.0f);
        const float id = d != 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
        const int q = __float2int_rn(__fmul_rn(v, id));  // to nearest even, as the CPU's
        const int sum = warp_sum(q);
        out[i].qs[lane] = static_cast<int8_t>(q);
        if (lane == 0) {
            out[i].d = fp16_round(d);
            out[i].s = fp16_round(__fmul_rn(d, static_cast<float>(sum)));
        }
    }
}

// Block b of an int8-type row as 8 words of 4 quants in element order, its scale and (Q4)
// its offset: a Q4 byte holds element i in its low and i + 16 in its high nibble.
template <DType T>
__device__ __forceinline__ void load_block(const uint8_t* row, int64_t b, int (&q)[8], float& d,
                                           float& m) {
    if constexpr (T == DType::kQ8_0) {
        const BlockQ8_0& blk = reinterpret_cast<const BlockQ8_0*>(row)[b];
        const auto* qs = reinterpret_cast<const uint8_t*>(blk.qs);
#pragma unroll
        for (int j = 0; j < 8; ++j) q[j] = load_word(qs + 4 * j);
        d = half_to_float(blk.d);
        m = 0.0f;
    } else {
        using Block = std::conditional_t<T == DType::kQ4_0, BlockQ4_0, BlockQ4_1>;
        const Block& blk = reinterpret_cast<const Block*>(row)[b];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const auto w = static_cast<uint32_t>(load_word(blk.qs + 4 * j));
            q[j] = static_cast<int>(w & 0x0F0F0F0Fu);
            q[4 + j] = static_cast<int>((w >> 4) & 0x0F0F0F0Fu);
        }
        d = half_to_float(blk.d);
        if constexpr (T == DType::kQ4_0) {
            m = -8.0f * d;  // exact
        } else {
            m = half_to_float(blk.m);
        }
    }
}

// Lane sums into y: every lane takes part in the shuffles.
__device__ __forceinline__ void store_rows(const float (&acc)[kTokens], int nt, float* y,
                                           int64_t ldy, int64_t r) {
#pragma unroll
    for (int t = 0; t < kTokens; ++t) {
        const float v = warp_sum(acc[t]);
        if (threadIdx.x % 32 == 0 && t < nt) y[t * ldy + r] = v;
    }
}

template <DType T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) matmul_int8_kernel(MatmulLaunch a) {
    const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
    if (r >= a.rows) return;  // the whole warp: no block-wide barrier follows
    const int64_t nb = a.cols / kQK;
    const uint8_t* row = static_cast<const uint8_t*>(a.w) + r * a.row_stride;
    const auto* xq = static_cast<const BlockQ8A*>(a.xq);
    for (int64_t t0 = static_cast<int64_t>(blockIdx.y) * kTokens; t0 < a.n;
         t0 += static_cast<int64_t>(gridDim.y) * kTokens) {
        const int nt = static_cast<int>(min(static_cast<int64_t>(kTokens), a.n - t0));
        float acc[kTokens];
        float macc[kTokens];
#pragma unroll
        for (int t = 0; t < kTokens; ++t) acc[t] = macc[t] = 0.0f;
        for (int64_t b = threadIdx.x % 32; b < nb; b += 32) {
            int wq[8];
            float wd;
            float wm;
            load_block<T>(row, b, wq, wd, wm);
#pragma unroll
            for (int t = 0; t < kTokens; ++t) {
                if (t >= nt) break;
                const BlockQ8A& xb = xq[(t0 + t) * nb + b];
                const int* xw = reinterpret_cast<const int*>(xb.qs);
                int sum = 0;
#pragma unroll
                for (int j = 0; j < 8; ++j) sum = __dp4a(wq[j], xw[j], sum);
                acc[t] = __fmaf_rn(static_cast<float>(sum), __fmul_rn(wd, xb.d), acc[t]);
                if constexpr (T != DType::kQ8_0) macc[t] = __fmaf_rn(wm, xb.s, macc[t]);
            }
        }
#pragma unroll
        for (int t = 0; t < kTokens; ++t) acc[t] = __fadd_rn(acc[t], macc[t]);
        store_rows(acc, nt, a.y + t0 * a.ldy, a.ldy, r);
    }
}

template <DType T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) matmul_float_kernel(MatmulLaunch a) {
    const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
    if (r >= a.rows) return;
    const uint8_t* row = static_cast<const uint8_t*>(a.w) + r * a.row_stride;
    for (int64_t t0 = static_cast<int64_t>(blockIdx.y) * kTokens; t0 < a.n;
         t0 += static_cast<int64_t>(gridDim.y) * kTokens) {
        const int nt = static_cast<int>(min(static_cast<int64_t>(kTokens), a.n - t0));
        const float* x = a.x + t0 * a.ldx;
        float acc[kTokens];
#pragma unroll
        for (int t = 0; t < kTokens; ++t) acc[t] = 0.0f;
        for (int64_t c = threadIdx.x % 32; c < a.cols; c += 32) {
            const float w = weight_value<T>(row, c);
#pragma unroll
            for (int t = 0; t < kTokens; ++t) {
                if (t >= nt) break;
                acc[t] = __fmaf_rn(w, x[t * a.ldx + c], acc[t]);
            }
        }
        store_rows(acc, nt, a.y + t0 * a.ldy, a.ldy, r);
    }
}

}  // namespace

size_t activation_bytes(int64_t n, int64_t cols) {
    return static_cast<size_t>(n) * static_cast<size_t>(cols / kQK) * sizeof(BlockQ8A);
}

cudaError_t launch_quantize_activations(const float* x, int64_t ldx, int64_t n, int64_t cols,
                                        void* blocks, cudaStream_t stream) {
    const int64_t total = n * (cols / kQK);
    if (total == 0) return cudaSuccess;
    const int64_t per_block = kQuantThreads / 32;
    const auto grid =
        static_cast<unsigned>(std::min((total + per_block - 1) / per_block, kMaxQuantBlocks));
    quantize_activations_kernel<<<grid, kQuantThreads, 0, stream>>>(x, ldx, n, cols / kQK,
                                                                    static_cast<BlockQ8A*>(blocks));
    return cudaGetLastError();
}

cudaError_t launch_matmul(const MatmulLaunch& args, cudaStream_t stream) {
    if (args.n == 0 || args.rows == 0) return cudaSuccess;
    const dim3 grid(
        static_cast<unsigned>((args.rows + kWarpsPerBlock - 1) / kWarpsPerBlock),
        static_cast<unsigned>(std::min((args.n + kTokens - 1) / kTokens, kMaxTokenPasses)));
    const bool known = with_weight_type(args.type, [&](auto tag) {
        constexpr DType kType = decltype(tag)::value;
        if constexpr (kType == DType::kQ4_0 || kType == DType::kQ4_1 || kType == DType::kQ8_0) {
            matmul_int8_kernel<kType><<<grid, kWarpsPerBlock * 32, 0, stream>>>(args);
        } else {
            matmul_float_kernel<kType><<<grid, kWarpsPerBlock * 32, 0, stream>>>(args);
        }
    });
    if (!known) return cudaErrorInvalidValue;
    return cudaGetLastError();
}

}  // namespace deltaserve::kernels::cuda
