// SlotPool's row ops: host memory directly, a device's through its backend.
#include <cstring>
#include <vector>

#include "deltaserve/kvstore/slot_pool.h"
#include "row_io.h"

namespace deltaserve::kvstore {

namespace {
constexpr kernels::Exec kOnDevice{};
}  // namespace

Status SlotPool::store(int32_t layer, std::span<const int32_t> slots, const float* k,
                       const float* v, int64_t ld) {
    const int32_t width = options_.kv_dim;
    const auto n = static_cast<int64_t>(slots.size());
    if (device_ == nullptr) {
        for (int64_t i = 0; i < n; ++i) {
            write_kv_row(options_.dtype, k_row(layer, slots[i]), k + i * ld, width);
            write_kv_row(options_.dtype, v_row(layer, slots[i]), v + i * ld, width);
        }
        return Status();
    }
    DS_RETURN_IF_ERROR(device_->store_rows(options_.dtype, width, k, ld, n, base(layer, 0),
                                           row_bytes_, slots.data(), kOnDevice));
    return device_->store_rows(options_.dtype, width, v, ld, n, base(layer, 1), row_bytes_,
                               slots.data(), kOnDevice);
}

Status SlotPool::read_rows(int32_t layer, std::span<const int32_t> slots, uint8_t* bytes) const {
    const size_t n = slots.size(), row = row_bytes_;
    if (device_ == nullptr) {
        for (size_t i = 0; i < n; ++i) {
            std::memcpy(bytes + i * row, base(layer, 0) + slots[i] * row, row);
            std::memcpy(bytes + (n + i) * row, base(layer, 1) + slots[i] * row, row);
        }
        return Status();
    }
    if (n == 0) return Status();
    // Gathered on the device, then one copy over.
    DS_ASSIGN_OR_RETURN(kernels::Buffer staged, device_->alloc(2 * n * row));
    auto* s = static_cast<uint8_t*>(staged.data());
    for (int kv = 0; kv < 2; ++kv) {
        DS_RETURN_IF_ERROR(device_->copy_rows(s + kv * n * row, row, nullptr, base(layer, kv), row,
                                              slots.data(), row, static_cast<int64_t>(n),
                                              kOnDevice));
    }
    return device_->copy_out(bytes, s, 2 * n * row, kOnDevice);
}

Status SlotPool::write_rows(int32_t layer, std::span<const int32_t> slots, const uint8_t* bytes) {
    const size_t n = slots.size(), row = row_bytes_;
    if (device_ == nullptr) {
        for (size_t i = 0; i < n; ++i) {
            for (int kv = 0; kv < 2; ++kv) {
                uint8_t* dst = base(layer, kv) + slots[i] * row;
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
    DS_ASSIGN_OR_RETURN(kernels::Buffer staged, device_->alloc(2 * n * row));
    auto* s = static_cast<uint8_t*>(staged.data());
    DS_RETURN_IF_ERROR(device_->copy_in(s, bytes, 2 * n * row, kOnDevice));
    for (int kv = 0; kv < 2; ++kv) {
        DS_RETURN_IF_ERROR(device_->copy_rows(base(layer, kv), row, slots.data(), s + kv * n * row,
                                              row, nullptr, row, static_cast<int64_t>(n),
                                              kOnDevice));
    }
    // The staging buffer goes when this returns: wait for the scatter that reads it.
    return device_->synchronize(kOnDevice);
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
