// One KV cache row at a cache's precision: fp32 values in, fp32 values out. The host side of
// Backend::store_rows, shared by the caches that write their rows themselves (kvstore/).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "deltaserve/common/fp16.h"
#include "deltaserve/kernels/dtype.h"

namespace deltaserve::kernels {

// n floats into a row of dtype kF16 (round to nearest even, as F16C) or kF32.
inline void write_kv_row(DType dtype, uint8_t* dst, const float* src, int32_t n) {
    if (dtype != DType::kF16) {
        std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
        return;
    }
    auto* d = reinterpret_cast<uint16_t*>(dst);
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    }
    for (; i < n; ++i) d[i] = fp32_to_fp16(src[i]);
}

inline void read_kv_row(DType dtype, const uint8_t* src, float* dst, int32_t n) {
    if (dtype != DType::kF16) {
        std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
        return;
    }
    const auto* s = reinterpret_cast<const uint16_t*>(src);
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(dst + i,
                         _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
    }
    for (; i < n; ++i) dst[i] = fp16_to_fp32(s[i]);
}

}  // namespace deltaserve::kernels
