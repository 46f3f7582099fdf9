// Writing and reading cache rows at the pool's precision. Private to kvstore/.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "deltaserve/common/fp16.h"
#include "deltaserve/kernels/dtype.h"

namespace deltaserve::kvstore {

// n floats into a row of dtype kF16 (round to nearest even, as F16C) or kF32.
inline void write_row(kernels::DType dtype, uint8_t* dst, const float* src, int32_t n) {
    if (dtype != kernels::DType::kF16) {
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

inline void read_row(kernels::DType dtype, const uint8_t* src, float* dst, int32_t n) {
    if (dtype != kernels::DType::kF16) {
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

// Asks for a row's cache lines ahead of its use (rows read in an order the hardware
// prefetcher cannot guess: references scattered through a pool).
inline void prefetch_row(const uint8_t* row, int32_t bytes) {
    for (int32_t b = 0; b < bytes; b += 64)
        _mm_prefetch(reinterpret_cast<const char*>(row + b), _MM_HINT_T0);
}

}  // namespace deltaserve::kvstore
