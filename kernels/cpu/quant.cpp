#include "deltaserve/kernels/quant.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "blocks.h"
#include "deltaserve/common/fp16.h"
#include "deltaserve/common/status.h"
#include "dequantize_k.h"

namespace deltaserve::kernels {

namespace {

void dequantize_q4_0(const BlockQ4_0* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float d = fp16_to_fp32(b[i].d);
        for (int j = 0; j < kQK / 2; ++j) {
            y[i * kQK + j] = d * static_cast<float>((b[i].qs[j] & 0x0F) - 8);
            y[i * kQK + j + kQK / 2] = d * static_cast<float>((b[i].qs[j] >> 4) - 8);
        }
    }
}

// d * q + m as ggml computes it: the product (an fp16 scale times a 4- or 5-bit quant) is
// exact in fp32, so contracted into an FMA or not, the one rounding is the sum's.
inline float mul_add(float a, float b, float c) { return a * b + c; }

void dequantize_q4_1(const BlockQ4_1* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float d = fp16_to_fp32(b[i].d);
        const float m = fp16_to_fp32(b[i].m);
        for (int j = 0; j < kQK / 2; ++j) {
            y[i * kQK + j] = mul_add(d, static_cast<float>(b[i].qs[j] & 0x0F), m);
            y[i * kQK + j + kQK / 2] = mul_add(d, static_cast<float>(b[i].qs[j] >> 4), m);
        }
    }
}

// Q5_0 / Q5_1: element j's fifth bit is bit j of qh.
template <bool kHasMin>
void dequantize_q5(const void* src, float* y, int64_t nb) {
    using Block = std::conditional_t<kHasMin, BlockQ5_1, BlockQ5_0>;
    const Block* b = static_cast<const Block*>(src);
    for (int64_t i = 0; i < nb; ++i, y += kQK) {
        const float d = fp16_to_fp32(b[i].d);
        uint32_t qh;
        std::memcpy(&qh, b[i].qh, 4);
        for (int j = 0; j < kQK / 2; ++j) {
            const int lo = (b[i].qs[j] & 0x0F) | (((qh >> j) & 1) << 4);
            const int hi = (b[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
            if constexpr (kHasMin) {
                const float m = fp16_to_fp32(b[i].m);
                y[j] = mul_add(d, static_cast<float>(lo), m);
                y[j + kQK / 2] = mul_add(d, static_cast<float>(hi), m);
            } else {
                y[j] = static_cast<float>(lo - 16) * d;
                y[j + kQK / 2] = static_cast<float>(hi - 16) * d;
            }
        }
    }
}

void dequantize_iq4_nl(const BlockIQ4_NL* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += kQK) {
        const float d = fp16_to_fp32(b[i].d);
        for (int j = 0; j < kQK / 2; ++j) {
            y[j] = d * static_cast<float>(kIQ4Values[b[i].qs[j] & 0x0F]);
            y[j + kQK / 2] = d * static_cast<float>(kIQ4Values[b[i].qs[j] >> 4]);
        }
    }
}

void dequantize_q8_0(const BlockQ8_0* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float d = fp16_to_fp32(b[i].d);
        for (int j = 0; j < kQK; ++j) y[i * kQK + j] = d * static_cast<float>(b[i].qs[j]);
    }
}

float fp16_round(float x) { return fp16_to_fp32(fp32_to_fp16(x)); }

}  // namespace

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
    switch (t) {
        case DType::kF32:
            std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
            return;
        case DType::kF16: {
            const auto* h = static_cast<const uint16_t*>(src);
            for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(h[i]);
            return;
        }
        case DType::kBF16: {
            const auto* h = static_cast<const uint16_t*>(src);
            for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(h[i]);
            return;
        }
        case DType::kQ4_0:
            return dequantize_q4_0(static_cast<const BlockQ4_0*>(src), dst, n / kQK);
        case DType::kQ4_1:
            return dequantize_q4_1(static_cast<const BlockQ4_1*>(src), dst, n / kQK);
        case DType::kQ8_0:
            return dequantize_q8_0(static_cast<const BlockQ8_0*>(src), dst, n / kQK);
        case DType::kQ5_0:
            return dequantize_q5<false>(src, dst, n / kQK);
        case DType::kQ5_1:
            return dequantize_q5<true>(src, dst, n / kQK);
        case DType::kIQ4_NL:
            return dequantize_iq4_nl(static_cast<const BlockIQ4_NL*>(src), dst, n / kQK);
        case DType::kQ2_K:
            return dequantize_q2_k(static_cast<const BlockQ2_K*>(src), dst, n / kQKK);
        case DType::kQ3_K:
            return dequantize_q3_k(static_cast<const BlockQ3_K*>(src), dst, n / kQKK);
        case DType::kQ4_K:
            return dequantize_q4_k(static_cast<const BlockQ4_K*>(src), dst, n / kQKK);
        case DType::kQ5_K:
            return dequantize_q5_k(static_cast<const BlockQ5_K*>(src), dst, n / kQKK);
        case DType::kQ6_K:
            return dequantize_q6_k(static_cast<const BlockQ6_K*>(src), dst, n / kQKK);
        case DType::kIQ4_XS:
            return dequantize_iq4_xs(static_cast<const BlockIQ4_XS*>(src), dst, n / kQKK);
        default:
            DS_CHECK(false, "dequantize_row: unsupported type");
    }
}

void quantize_row(DType t, const float* x, void* dst, int64_t n) {
    switch (t) {
        case DType::kF32:
            std::memcpy(dst, x, static_cast<size_t>(n) * sizeof(float));
            return;
        case DType::kF16: {
            auto* h = static_cast<uint16_t*>(dst);
            for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_fp16(x[i]);
            return;
        }
        case DType::kBF16: {
            auto* h = static_cast<uint16_t*>(dst);
            for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_bf16(x[i]);
            return;
        }
        case DType::kQ8_0: {
            auto* b = static_cast<BlockQ8_0*>(dst);
            for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
                float amax = 0;
                for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
                const float d = amax / 127.0f;
                const float id = d != 0 ? 1.0f / d : 0.0f;
                b[i].d = fp32_to_fp16(d);
                for (int j = 0; j < kQK; ++j)
                    b[i].qs[j] = static_cast<int8_t>(std::round(x[j] * id));
            }
            return;
        }
        case DType::kQ4_0: {
            auto* b = static_cast<BlockQ4_0*>(dst);
            for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
                float amax = 0, vmax = 0;
                for (int j = 0; j < kQK; ++j) {
                    if (std::fabs(x[j]) > amax) {
                        amax = std::fabs(x[j]);
                        vmax = x[j];
                    }
                }
                const float d = vmax / -8.0f;
                const float id = d != 0 ? 1.0f / d : 0.0f;
                b[i].d = fp32_to_fp16(d);
                for (int j = 0; j < kQK / 2; ++j) {
                    const int q0 = std::min(15, static_cast<int>(x[j] * id + 8.5f));
                    const int q1 = std::min(15, static_cast<int>(x[j + kQK / 2] * id + 8.5f));
                    b[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
                }
            }
            return;
        }
        case DType::kQ4_1: {
            auto* b = static_cast<BlockQ4_1*>(dst);
            for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
                float mn = x[0], mx = x[0];
                for (int j = 1; j < kQK; ++j) {
                    mn = std::min(mn, x[j]);
                    mx = std::max(mx, x[j]);
                }
                const float d = (mx - mn) / 15.0f;
                const float id = d != 0 ? 1.0f / d : 0.0f;
                b[i].d = fp32_to_fp16(d);
                b[i].m = fp32_to_fp16(mn);
                for (int j = 0; j < kQK / 2; ++j) {
                    const int q0 = std::min(15, static_cast<int>((x[j] - mn) * id + 0.5f));
                    const int q1 =
                        std::min(15, static_cast<int>((x[j + kQK / 2] - mn) * id + 0.5f));
                    b[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
                }
            }
            return;
        }
        default:
            DS_CHECK(false, "quantize_row: unsupported type");
    }
}

void quantize_activations(const float* x, BlockQ8A* out, int64_t n) {
    const __m256 sign_mask = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
        __m256 v[4];
        __m256 amax = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
        for (int k = 0; k < 4; ++k) {
            v[k] = _mm256_loadu_ps(x + 8 * k);
            amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign_mask, v[k]));
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(v[k], v[k], _CMP_UNORD_Q));
        }
        __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(amax, 1), _mm256_castps256_ps128(amax));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float d = _mm_cvtss_f32(m4) / 127.0f;
        const __m256 id = _mm256_set1_ps(d != 0.0f ? 127.0f / _mm_cvtss_f32(m4) : 0.0f);
        __m256i q[4];
        for (int k = 0; k < 4; ++k) {
            q[k] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[k], id), _MM_ROUND_NEAREST));
        }
        // Sum of the quantized values, for the offset terms of Q4_0 / Q4_1.
        __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        __m128i s4 = _mm_add_epi32(_mm256_extracti128_si256(s, 1), _mm256_castsi256_si128(s));
        s4 = _mm_hadd_epi32(s4, s4);
        s4 = _mm_hadd_epi32(s4, s4);
        const int isum = _mm_cvtsi128_si32(s4);
        // Pack 32 x i32 -> 32 x i8 in element order.
        __m256i p0 = _mm256_packs_epi32(q[0], q[1]);
        __m256i p1 = _mm256_packs_epi32(q[2], q[3]);
        __m256i p = _mm256_packs_epi16(p0, p1);
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[i].qs), p);
        out[i].d = fp16_round(d);
        out[i].s = fp16_round(d * static_cast<float>(isum));
        // max_ps drops a NaN, and its quant is a finite -128: make the block's scale NaN so
        // that every output the NaN reaches is NaN.
        if (_mm256_movemask_ps(nan) != 0)
            out[i].d = out[i].s = std::numeric_limits<float>::quiet_NaN();
    }
}

}  // namespace deltaserve::kernels
