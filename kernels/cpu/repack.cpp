#include "deltaserve/kernels/repack.h"

#include <cstring>

#include "blocks.h"
#include "deltaserve/common/status.h"
#include "deltaserve/kernels/quant.h"

namespace deltaserve::kernels {

namespace {

static_assert(kRowInterleave == 8, "the x8 block layouts of blocks.h");

// The interleaved block of 8 rows' blocks at one column, and back. Row blocks and
// interleaved blocks are laid out as blocks.h describes.
template <class Block, class Packed>
void pack_block(const Block* const* rows, int64_t b, Packed& out) {
    constexpr int kWords = sizeof(Block::qs) / 4;
    for (int r = 0; r < 8; ++r) {
        const Block& blk = rows[r][b];
        out.d[r] = blk.d;
        if constexpr (requires { blk.m; }) out.m[r] = blk.m;
        for (int j = 0; j < kWords; ++j) std::memcpy(&out.qs[j][4 * r], &blk.qs[4 * j], 4);
    }
}

template <class Block, class Packed>
void unpack_block(const Packed& in, int r, Block& out) {
    constexpr int kWords = sizeof(Block::qs) / 4;
    out.d = in.d[r];
    if constexpr (requires { out.m; }) out.m = in.m[r];
    for (int j = 0; j < kWords; ++j) std::memcpy(&out.qs[4 * j], &in.qs[j][4 * r], 4);
}

template <class Block, class Packed>
void repack(const WeightMatrix& w, void* out) {
    const int64_t nb = w.cols / kQK;
    auto* dst = static_cast<Packed*>(out);
    for (int64_t g = 0; g < w.rows / 8; ++g) {
        const Block* rows[8];
        for (int r = 0; r < 8; ++r) rows[r] = reinterpret_cast<const Block*>(w.row(8 * g + r));
        for (int64_t b = 0; b < nb; ++b) pack_block(rows, b, dst[g * nb + b]);
    }
}

template <class Block, class Packed>
void dequantize_interleaved(const WeightMatrix& w, int64_t r, float* dst) {
    const int64_t nb = w.cols / kQK;
    const Packed* group = static_cast<const Packed*>(w.data) + (r / 8) * nb;
    Block blk;
    for (int64_t b = 0; b < nb; ++b) {
        unpack_block(group[b], static_cast<int>(r % 8), blk);
        dequantize_row(w.type, &blk, dst + b * kQK, kQK);
    }
}

}  // namespace

bool repackable(const WeightMatrix& w) {
    const bool type = w.type == DType::kQ4_0 || w.type == DType::kQ4_1 || w.type == DType::kQ8_0;
    return type && w.interleave == 1 && w.rows > 0 && w.rows % kRowInterleave == 0 &&
           w.cols % kQK == 0;
}

WeightMatrix repack_rows(const WeightMatrix& w, void* out) {
    DS_CHECK(repackable(w), "repack_rows: the matrix cannot be repacked");
    switch (w.type) {
        case DType::kQ4_0:
            repack<BlockQ4_0, BlockQ4_0x8>(w, out);
            break;
        case DType::kQ4_1:
            repack<BlockQ4_1, BlockQ4_1x8>(w, out);
            break;
        default:
            repack<BlockQ8_0, BlockQ8_0x8>(w, out);
            break;
    }
    WeightMatrix packed = w;
    packed.data = out;
    packed.interleave = kRowInterleave;
    return packed;
}

void dequantize_weight_row(const WeightMatrix& w, int64_t r, float* dst) {
    if (w.interleave == 1) {
        dequantize_row(w.type, w.row(r), dst, w.cols);
        return;
    }
    switch (w.type) {
        case DType::kQ4_0:
            dequantize_interleaved<BlockQ4_0, BlockQ4_0x8>(w, r, dst);
            break;
        case DType::kQ4_1:
            dequantize_interleaved<BlockQ4_1, BlockQ4_1x8>(w, r, dst);
            break;
        case DType::kQ8_0:
            dequantize_interleaved<BlockQ8_0, BlockQ8_0x8>(w, r, dst);
            break;
        default:
            DS_CHECK(false, "dequantize_weight_row: an interleaved matrix of an unknown type");
    }
}

}  // namespace deltaserve::kernels
