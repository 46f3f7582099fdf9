// The activations of the K-quant kernels, as ggml's quantize_row_q8_K rounds them.
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "blocks.h"

namespace deltaserve::kernels {

void quantize_activations_q8k(const float* x, BlockQ8K* out, int64_t n) {
    for (int64_t i = 0; i < n / kQKK; ++i, x += kQKK) {
        BlockQ8K& y = out[i];
        // The first value of the largest magnitude, with its sign (ggml's scan, where NaN
        // never wins a comparison).
        float amax = 0.0f, max = 0.0f;
        bool nan = false;
        for (int j = 0; j < kQKK; ++j) {
            const float ax = std::fabs(x[j]);
            nan |= ax != ax;
            if (ax > amax) {
                amax = ax;
                max = x[j];
            }
        }
        if (amax == 0.0f || nan) {
            // A NaN makes the block's scale NaN (ggml's scan would drop it, and the products
            // of the rest would hide it): every output it reaches is NaN.
            std::memset(&y, 0, sizeof(y));
            if (nan) y.d = std::numeric_limits<float>::quiet_NaN();
            continue;
        }
        const float iscale = -127.0f / max;
        const __m256 vs = _mm256_set1_ps(iscale);
        const __m256i top = _mm256_set1_epi32(127);
        for (int j = 0; j < kQKK; j += 32) {
            __m256i q[4];
            // Round to nearest even (the MXCSR default), as ggml's nearest_int; the
            // conversion is defined for any input (NaN and overflow give INT_MIN).
            for (int k = 0; k < 4; ++k) {
                const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + j + 8 * k), vs);
                q[k] = _mm256_min_epi32(_mm256_cvtps_epi32(v), top);
            }
            __m256i p =
                _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(y.qs + j), p);
        }
        for (int k = 0; k < kQKK / 16; ++k) {
            int sum = 0;
            for (int l = 0; l < 16; ++l) sum += y.qs[16 * k + l];
            y.bsums[k] = static_cast<int16_t>(sum);
        }
        y.d = 1.0f / iscale;
    }
}

}  // namespace deltaserve::kernels
