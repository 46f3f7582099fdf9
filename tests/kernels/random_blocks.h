// Random weight rows of any block type for the kernel tests: random quant bytes (every bit
// pattern of these formats is a valid quant) with random finite fp16 scales.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "deltaserve/common/fp16.h"
#include "deltaserve/kernels/dtype.h"

namespace deltaserve::kernels::test_blocks {

// Byte offsets of a block's fp16 fields (ggml-common.h); empty for the float types.
inline std::vector<int> half_offsets(DType t) {
    switch (t) {
        case DType::kQ4_1:
        case DType::kQ5_1:
        case DType::kQ4_K:
        case DType::kQ5_K:
            return {0, 2};
        case DType::kQ4_0:
        case DType::kQ5_0:
        case DType::kQ8_0:
        case DType::kIQ4_NL:
        case DType::kIQ4_XS:
            return {0};
        case DType::kQ2_K:
            return {80, 82};
        case DType::kQ3_K:
            return {108};
        case DType::kQ6_K:
            return {208};
        default:
            return {};
    }
}

// rows x cols of type t (a quantized type). full_range: scales are any finite half
// (subnormals to 65504); otherwise |scale| < `scale`, for values of a plausible size.
inline std::vector<uint8_t> random_rows(DType t, int64_t rows, int64_t cols, uint32_t seed,
                                        bool full_range = false, float scale = 0.01f) {
    std::mt19937 rng(seed);
    const DTypeTraits& tr = dtype_traits(t);
    std::vector<uint8_t> data(row_bytes(t, cols) * rows);
    for (auto& b : data) b = static_cast<uint8_t>(rng());
    std::uniform_real_distribution<float> ud(-scale, scale);
    for (size_t at = 0; at < data.size(); at += tr.block_bytes) {
        for (int off : half_offsets(t)) {
            uint16_t h = static_cast<uint16_t>(rng());
            if (full_range) {
                if ((h & 0x7C00) == 0x7C00) h &= 0xBFFF;  // inf / NaN exponent -> finite
            } else {
                h = fp32_to_fp16(ud(rng));
            }
            std::memcpy(&data[at + off], &h, 2);
        }
    }
    return data;
}

}  // namespace deltaserve::kernels::test_blocks
