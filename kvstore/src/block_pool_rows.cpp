// BlockPool's row ops: host memory directly, a device's through its backend (layer_rows.h).
#include <cstring>
#include <vector>

#include "deltaserve/kvstore/block_pool.h"
#include "layer_rows.h"

namespace deltaserve::kvstore {

namespace {
// The device's default stream for the calling thread: the forward pass's, which runs there.
constexpr kernels::Exec kOnDevice{};
}  // namespace

LayerRows BlockPool::rows_of(int32_t layer) const {
    return LayerRows{device_, base(layer, 0), base(layer, 1), row_bytes_};
}

Status BlockPool::store(int32_t layer, std::span<const int32_t> slots, const float* k,
                        const float* v, int64_t ld) {
    return store_layer_rows(rows_of(layer), options_.dtype, options_.kv_dim, slots, k, v, ld);
}

Status BlockPool::read_rows(int32_t layer, std::span<const int32_t> slots, uint8_t* bytes) const {
    return read_layer_rows(rows_of(layer), slots, bytes);
}

Status BlockPool::write_rows(int32_t layer, std::span<const int32_t> slots, const uint8_t* bytes) {
    return write_layer_rows(rows_of(layer), slots, bytes);
}

Status BlockPool::copy_rows(int32_t dst_slot, int32_t src_slot, int32_t n) {
    const size_t bytes = static_cast<size_t>(n) * row_bytes_;
    for (int32_t l = 0; l < options_.n_layers; ++l) {
        for (int kv = 0; kv < 2; ++kv) {
            uint8_t* dst = base(l, kv) + static_cast<size_t>(dst_slot) * row_bytes_;
            const uint8_t* src = base(l, kv) + static_cast<size_t>(src_slot) * row_bytes_;
            if (device_ == nullptr) {
                std::memcpy(dst, src, bytes);
            } else {
                DS_RETURN_IF_ERROR(device_->copy(dst, src, bytes, kOnDevice));
            }
        }
    }
    return Status();
}

}  // namespace deltaserve::kvstore
