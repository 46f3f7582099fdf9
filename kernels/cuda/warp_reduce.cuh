// Warp-wide reductions shared by the kernels: every lane of a full warp gets the result.
#pragma once

namespace deltaserve::kernels::cuda {

template <class T>
__device__ __forceinline__ T warp_sum(T v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

}  // namespace deltaserve::kernels::cuda
