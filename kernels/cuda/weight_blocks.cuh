// Weight rows on the device, in ggml's row-major layouts (kernels/cpu/blocks.h): one element
// at a time (embed_rows, the float matmul) or a block's quants as 32-bit words (the int8
// matmul). Element values round as kernels::dequantize_row's do.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "../cpu/blocks.h"
#include "deltaserve/kernels/dtype.h"

namespace deltaserve::kernels::cuda {

__device__ __forceinline__ float half_to_float(uint16_t h) {
    return __half2float(__ushort_as_half(h));
}

// Four bytes from a 2-byte aligned address: Q4_0 and Q8_0 blocks are 18 and 34 bytes long.
__device__ __forceinline__ int load_word(const uint8_t* p) {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
    return static_cast<int>(static_cast<uint32_t>(h[0]) | (static_cast<uint32_t>(h[1]) << 16));
}

// Element c of a row of type T.
template <DType T>
__device__ __forceinline__ float weight_value(const uint8_t* row, int64_t c) {
    if constexpr (T == DType::kF32) {
        return reinterpret_cast<const float*>(row)[c];
    } else if constexpr (T == DType::kF16) {
        return half_to_float(reinterpret_cast<const uint16_t*>(row)[c]);
    } else if constexpr (T == DType::kBF16) {
        return __uint_as_float(static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(row)[c])
                               << 16);
    } else if constexpr (T == DType::kQ8_0) {
        const BlockQ8_0& b = reinterpret_cast<const BlockQ8_0*>(row)[c / kQK];
        return __fmul_rn(half_to_float(b.d), static_cast<float>(b.qs[c % kQK]));
    } else {
        static_assert(T == DType::kQ4_0 || T == DType::kQ4_1);
        using Block = std::conditional_t<T == DType::kQ4_0, BlockQ4_0, BlockQ4_1>;
        const Block& b = reinterpret_cast<const Block*>(row)[c / kQK];
        const int j = static_cast<int>(c % kQK);
        const int byte = b.qs[j % (kQK / 2)];
        const int q = j < kQK / 2 ? byte & 0x0F : byte >> 4;
        const float d = half_to_float(b.d);
        if constexpr (T == DType::kQ4_0) {
            return __fmul_rn(d, static_cast<float>(q - 8));
        } else {
            return __fadd_rn(__fmul_rn(d, static_cast<float>(q)), half_to_float(b.m));
        }
    }
}

// Calls f(std::integral_constant<DType, T>{}) with T = t for the types the kernels read (F32,
// F16, BF16, Q4_0, Q4_1, Q8_0); false for any other type.
template <class F>
bool with_weight_type(DType t, F&& f) {
    switch (t) {
        case DType::kF32:
            f(std::integral_constant<DType, DType::kF32>{});
            return true;
        case DType::kF16:
            f(std::integral_constant<DType, DType::kF16>{});
            return true;
        case DType::kBF16:
            f(std::integral_constant<DType, DType::kBF16>{});
            return true;
        case DType::kQ4_0:
            f(std::integral_constant<DType, DType::kQ4_0>{});
            return true;
        case DType::kQ4_1:
            f(std::integral_constant<DType, DType::kQ4_1>{});
            return true;
        case DType::kQ8_0:
            f(std::integral_constant<DType, DType::kQ8_0>{});
            return true;
        default:
            return false;
    }
}

}  // namespace deltaserve::kernels::cuda
