// SlotPool's row ops: host memory directly, a device's through its backend (layer_rows.h).
#include <cstring>
#include <vector>

#include "deltaserve/kvstore/slot_pool.h"
#include "layer_rows.h"

namespace deltaserve::kvstore {

namespace {
constexpr kernels::Exec kOnDevice{};
}  // namespace

LayerRows SlotPool::rows_of(int32_t layer) const {
    return LayerRows{device_, base(layer, 0), base(layer, 1), row_bytes_};
}

Status SlotPool::store(int32_t layer, std::span<const int32_t> slots, const float* k,
                       const float* v, int64_t ld) {
    return store_layer_rows(rows_of(layer), options_.dtype, options_.kv_dim, slots, k, v, ld);
}

Status SlotPool::read_rows(int32_t layer, std::span<const int32_t> slots, uint8_t* bytes) const {
    return read_layer_rows(rows_of(layer), slots, bytes);
}

Status SlotPool::write_rows(int32_t layer, std::span<const int32_t> slots, const uint8_t* bytes) {
    return write_layer_rows(rows_of(layer), slots, bytes);
}

Status SlotPool::move_rows(std::span<const int32_t> from, std::span<const int32_t> to) {
    DS_CHECK(from.size() == to.size(), "move_rows: lists of different lengths");
    const size_t n = from.size(), row = row_bytes_;
    for (int32_t l = 0; l < options_.n_layers; ++l) {
        for (int kv = 0; kv < 2; ++kv) {
            if (device_ == nullptr) {
                for (size_t i = 0; i < n; ++i)
                    std::memcpy(base(l, kv) + to[i] * row, base(l, kv) + from[i] * row, row);
                continue;
            }
            if (n == 0) continue;
            DS_RETURN_IF_ERROR(device_->copy_rows(base(l, kv), row, to.data(), base(l, kv), row,
                                                  from.data(), row, static_cast<int64_t>(n),
                                                  kOnDevice));
        }
    }
    return Status();
}

}  // namespace deltaserve::kvstore
