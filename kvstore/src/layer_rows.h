// Row ops on one layer's K and V arrays (rows row_bytes apart, slot-indexed), in host memory
// (device null) or a device backend's (through it, on its default stream; slot lists in host
// memory): what BlockPool's and SlotPool's row ops share. Private to kvstore/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "deltaserve/common/status.h"
#include "deltaserve/kernels/backend.h"
#include "deltaserve/kernels/dtype.h"

namespace deltaserve::kvstore {

struct LayerRows {
    kernels::Backend* device = nullptr;
    uint8_t* k = nullptr;
    uint8_t* v = nullptr;
    size_t row_bytes = 0;
};

// n fp32 rows of K and of V (`width` values, ld floats apart; in the rows' memory) into
// `slots` at `dtype`.
Status store_layer_rows(const LayerRows& l, kernels::DType dtype, int32_t width,
                        std::span<const int32_t> slots, const float* k, const float* v, int64_t ld);
// The K rows then the V rows of `slots` as bytes in host memory (2 * slots.size() rows).
Status read_layer_rows(const LayerRows& l, std::span<const int32_t> slots, uint8_t* bytes);
// The same bytes into `slots`; zeros with `bytes` null.
Status write_layer_rows(const LayerRows& l, std::span<const int32_t> slots, const uint8_t* bytes);

}  // namespace deltaserve::kvstore
