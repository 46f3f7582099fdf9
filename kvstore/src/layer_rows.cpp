#include "layer_rows.h"

#include <cstring>
#include <vector>

#include "row_io.h"

namespace deltaserve::kvstore {

namespace {
// The device's default stream for the calling thread: the forward pass's, which runs there.
constexpr kernels::Exec kOnDevice{};
}  // namespace

Status store_layer_rows(const LayerRows& l, kernels::DType dtype, int32_t width,
                        std::span<const int32_t> slots, const float* k, const float* v,
                        int64_t ld) {
    const auto n = static_cast<int64_t>(slots.size());
    if (l.device == nullptr) {
        for (int64_t i = 0; i < n; ++i) {
            write_kv_row(dtype, l.k + slots[i] * l.row_bytes, k + i * ld, width);
            write_kv_row(dtype, l.v + slots[i] * l.row_bytes, v + i * ld, width);
        }
        return Status();
    }
    DS_RETURN_IF_ERROR(
        l.device->store_rows(dtype, width, k, ld, n, l.k, l.row_bytes, slots.data(), kOnDevice));
    return l.device->store_rows(dtype, width, v, ld, n, l.v, l.row_bytes, slots.data(), kOnDevice);
}

Status read_layer_rows(const LayerRows& l, std::span<const int32_t> slots, uint8_t* bytes) {
    const size_t n = slots.size(), row = l.row_bytes;
    if (l.device == nullptr) {
        for (size_t i = 0; i < n; ++i) {
            std::memcpy(bytes + i * row, l.k + slots[i] * row, row);
            std::memcpy(bytes + (n + i) * row, l.v + slots[i] * row, row);
        }
        return Status();
    }
    if (n == 0) return Status();
    // Gathered on the device, then one copy over.
    DS_ASSIGN_OR_RETURN(kernels::Buffer staged, l.device->alloc(2 * n * row));
    auto* s = static_cast<uint8_t*>(staged.data());
    for (int kv = 0; kv < 2; ++kv) {
        DS_RETURN_IF_ERROR(l.device->copy_rows(s + kv * n * row, row, nullptr, kv == 0 ? l.k : l.v,
                                               row, slots.data(), row, static_cast<int64_t>(n),
                                               kOnDevice));
    }
    return l.device->copy_out(bytes, s, 2 * n * row, kOnDevice);
}

Status write_layer_rows(const LayerRows& l, std::span<const int32_t> slots, const uint8_t* bytes) {
    const size_t n = slots.size(), row = l.row_bytes;
    if (l.device == nullptr) {
        for (size_t i = 0; i < n; ++i) {
            for (int kv = 0; kv < 2; ++kv) {
                uint8_t* dst = (kv == 0 ? l.k : l.v) + slots[i] * row;
                if (bytes == nullptr) {
                    std::memset(dst, 0, row);
                } else {
                    std::memcpy(dst, bytes + (kv * n + i) * row, row);
                }
            }
        }
        return Status();
    }
    if (n == 0) return Status();
    std::vector<uint8_t> zeros;
    if (bytes == nullptr) {
        zeros.assign(2 * n * row, 0);
        bytes = zeros.data();
    }
    DS_ASSIGN_OR_RETURN(kernels::Buffer staged, l.device->alloc(2 * n * row));
    auto* s = static_cast<uint8_t*>(staged.data());
    DS_RETURN_IF_ERROR(l.device->copy_in(s, bytes, 2 * n * row, kOnDevice));
    for (int kv = 0; kv < 2; ++kv) {
        DS_RETURN_IF_ERROR(l.device->copy_rows(kv == 0 ? l.k : l.v, row, slots.data(),
                                               s + kv * n * row, row, nullptr, row,
                                               static_cast<int64_t>(n), kOnDevice));
    }
    // The staging buffer goes when this returns: wait for the scatter that reads it.
    return l.device->synchronize(kOnDevice);
}

}  // namespace deltaserve::kvstore
