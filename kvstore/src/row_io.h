// Reading cache rows ahead of their use, and the row conversions (kernels/kv_row.h).
// Private to kvstore/.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "deltaserve/kernels/kv_row.h"

namespace deltaserve::kvstore {

using kernels::read_kv_row;
using kernels::write_kv_row;

// Asks for a row's cache lines ahead of its use (rows read in an order the hardware
// prefetcher cannot guess: references scattered through a pool).
inline void prefetch_row(const uint8_t* row, int32_t bytes) {
    for (int32_t b = 0; b < bytes; b += 64)
        _mm_prefetch(reinterpret_cast<const char*>(row + b), _MM_HINT_T0);
}

}  // namespace deltaserve::kvstore
