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

// IQ4_NL's and IQ4_XS's 16 values (kernels::kIQ4Values).
__device__ __forceinline__ float iq4_value(int i) {
    constexpr int8_t kValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                    1,    13,   25,  38,  53,  69,  89,  113};
    return static_cast<float>(kValues[i]);
}

// Scale j and minimum j of a Q4_K / Q5_K block (kernels::scale_min_k4).
__device__ __forceinline__ void scale_min_k4_dev(int j, const uint8_t* q, int& sc, int& m) {
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Bytes of a super-block of T.
template <DType T>
__host__ __device__ constexpr int super_block_bytes() {
    if constexpr (T == DType::kQ2_K) return sizeof(BlockQ2_K);
    if constexpr (T == DType::kQ3_K) return sizeof(BlockQ3_K);
    if constexpr (T == DType::kQ4_K) return sizeof(BlockQ4_K);
    if constexpr (T == DType::kQ5_K) return sizeof(BlockQ5_K);
    if constexpr (T == DType::kQ6_K) return sizeof(BlockQ6_K);
    return sizeof(BlockIQ4_XS);
}

// Element e (< 256) of a K-quant or IQ4_XS super-block, as kernels::dequantize_row rounds
// it (ggml's dequantize_row_*: the same fp32 expression, no contraction).
template <DType T>
__device__ __forceinline__ float super_block_value(const uint8_t* block, int e) {
    const int j = e / 32, l = e % 32;  // 32-value chunk and place in it
    if constexpr (T == DType::kQ2_K) {
        const BlockQ2_K& b = *reinterpret_cast<const BlockQ2_K*>(block);
        const int q = (b.qs[32 * (j / 4) + l] >> (2 * (j % 4))) & 3;
        const int sc = b.scales[e / 16];
        const float dl = __fmul_rn(half_to_float(b.d), static_cast<float>(sc & 0xF));
        const float ml = __fmul_rn(half_to_float(b.dmin), static_cast<float>(sc >> 4));
        return __fsub_rn(__fmul_rn(dl, static_cast<float>(q)), ml);
    } else if constexpr (T == DType::kQ3_K) {
        const BlockQ3_K& b = *reinterpret_cast<const BlockQ3_K*>(block);
        const int lo = (b.qs[32 * (j / 4) + l] >> (2 * (j % 4))) & 3;
        const int q = lo - (((b.hmask[l] >> j) & 1) ? 0 : 4);
        const int k = e / 16;
        const int sl = k < 8 ? b.scales[k] & 0xF : b.scales[k - 8] >> 4;
        const int sh = (b.scales[8 + k % 4] >> (2 * (k / 4))) & 3;
        const float dl = __fmul_rn(half_to_float(b.d), static_cast<float>((sl | (sh << 4)) - 32));
        return __fmul_rn(dl, static_cast<float>(q));
    } else if constexpr (T == DType::kQ4_K || T == DType::kQ5_K) {
        using Block = std::conditional_t<T == DType::kQ4_K, BlockQ4_K, BlockQ5_K>;
        const Block& b = *reinterpret_cast<const Block*>(block);
        const int byte = b.qs[32 * (j / 2) + l];
        int q = j % 2 ? byte >> 4 : byte & 0xF;
        if constexpr (T == DType::kQ5_K) q += ((b.qh[l] >> j) & 1) << 4;
        int sc, m;
        scale_min_k4_dev(j, b.scales, sc, m);
        const float d1 = __fmul_rn(half_to_float(b.d), static_cast<float>(sc));
        const float m1 = __fmul_rn(half_to_float(b.dmin), static_cast<float>(m));
        return __fsub_rn(__fmul_rn(d1, static_cast<float>(q)), m1);
    } else if constexpr (T == DType::kQ6_K) {
        const BlockQ6_K& b = *reinterpret_cast<const BlockQ6_K*>(block);
        const int h = j / 4, k = j % 4;
        const int byte = b.ql[64 * h + 32 * (k % 2) + l];
        const int lo = k / 2 ? byte >> 4 : byte & 0xF;
        const int hi = (b.qh[32 * h + l] >> (2 * k)) & 3;
        const float dl = __fmul_rn(half_to_float(b.d), static_cast<float>(b.scales[e / 16]));
        return __fmul_rn(dl, static_cast<float>((lo | (hi << 4)) - 32));
    } else {
        static_assert(T == DType::kIQ4_XS);
        const BlockIQ4_XS& b = *reinterpret_cast<const BlockIQ4_XS*>(block);
        const int byte = b.qs[16 * j + l % 16];
        const int ls =
            ((b.scales_l[j / 2] >> (4 * (j % 2))) & 0xF) | (((b.scales_h >> (2 * j)) & 3) << 4);
        const float dl = __fmul_rn(half_to_float(b.d), static_cast<float>(ls - 32));
        return __fmul_rn(dl, iq4_value(l < 16 ? byte & 0xF : byte >> 4));
    }
}

// The 32-value block types with a fifth bit or a value table: Q5_0, Q5_1, IQ4_NL.
template <DType T>
__device__ __forceinline__ float block32_value(const uint8_t* row, int64_t c) {
    const int j = static_cast<int>(c % kQK);
    if constexpr (T == DType::kIQ4_NL) {
        const BlockIQ4_NL& b = reinterpret_cast<const BlockIQ4_NL*>(row)[c / kQK];
        const int byte = b.qs[j % (kQK / 2)];
        return __fmul_rn(half_to_float(b.d), iq4_value(j < kQK / 2 ? byte & 0x0F : byte >> 4));
    } else {
        using Block = std::conditional_t<T == DType::kQ5_0, BlockQ5_0, BlockQ5_1>;
        const Block& b = reinterpret_cast<const Block*>(row)[c / kQK];
        const int byte = b.qs[j % (kQK / 2)];
        const int lo = j < kQK / 2 ? byte & 0x0F : byte >> 4;
        const int q = lo | (((b.qh[j / 8] >> (j % 8)) & 1) << 4);
        const float d = half_to_float(b.d);
        if constexpr (T == DType::kQ5_0) {
            return __fmul_rn(static_cast<float>(q - 16), d);
        } else {
            return __fadd_rn(__fmul_rn(d, static_cast<float>(q)), half_to_float(b.m));
        }
    }
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
    } else if constexpr (T == DType::kQ5_0 || T == DType::kQ5_1 || T == DType::kIQ4_NL) {
        return block32_value<T>(row, c);
    } else if constexpr (T == DType::kQ2_K || T == DType::kQ3_K || T == DType::kQ4_K ||
                         T == DType::kQ5_K || T == DType::kQ6_K || T == DType::kIQ4_XS) {
        return super_block_value<T>(row + (c / kQKK) * super_block_bytes<T>(),
                                    static_cast<int>(c % kQKK));
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
// F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q2_K..Q6_K, IQ4_XS); false for any other.
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
        case DType::kQ5_0:
            f(std::integral_constant<DType, DType::kQ5_0>{});
            return true;
        case DType::kQ5_1:
            f(std::integral_constant<DType, DType::kQ5_1>{});
            return true;
        case DType::kIQ4_NL:
            f(std::integral_constant<DType, DType::kIQ4_NL>{});
            return true;
        case DType::kQ2_K:
            f(std::integral_constant<DType, DType::kQ2_K>{});
            return true;
        case DType::kQ3_K:
            f(std::integral_constant<DType, DType::kQ3_K>{});
            return true;
        case DType::kQ4_K:
            f(std::integral_constant<DType, DType::kQ4_K>{});
            return true;
        case DType::kQ5_K:
            f(std::integral_constant<DType, DType::kQ5_K>{});
            return true;
        case DType::kQ6_K:
            f(std::integral_constant<DType, DType::kQ6_K>{});
            return true;
        case DType::kIQ4_XS:
            f(std::integral_constant<DType, DType::kIQ4_XS>{});
            return true;
        default:
            return false;
    }
}

}  // namespace deltaserve::kernels::cuda
