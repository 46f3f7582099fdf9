// The int4 latent decoder's integer dot products per ISA (deltakv.h). Private to kernels/.
#pragma once

#include <cstdint>

#include "deltaserve/kernels/deltakv.h"

namespace deltaserve::kernels {

// acc[i * dec.d + r] = sum_j w8[r][j] * codes[i * dec.m4 + j] for n tokens whose codes
// (0..15, one byte each, zero past m) are m4 bytes apart. Exact in every version.
using Int4DotsFn = void (*)(const Int4Decoder& dec, const uint8_t* codes, int64_t n, int32_t* acc);

void int4_dots_avx2(const Int4Decoder& dec, const uint8_t* codes, int64_t n, int32_t* acc);
void int4_dots_avx512(const Int4Decoder& dec, const uint8_t* codes, int64_t n, int32_t* acc);

// The rows an ISA's vector loop leaves over (r from `from` to d), one at a time.
inline void int4_dots_rows(const Int4Decoder& dec, const uint8_t* q, int from, int32_t* acc) {
    for (int r = from; r < dec.d; ++r) {
        int32_t s = 0;
        for (int j = 0; j < dec.m4; ++j)
            s += dec.w[(static_cast<size_t>(j / 4) * dec.d + r) * 4 + j % 4] * q[j];
        acc[r] = s;
    }
}

}  // namespace deltaserve::kernels
