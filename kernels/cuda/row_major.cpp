#include "row_major.h"

#include <cstring>

#include "../cpu/blocks.h"
#include "deltaserve/common/status.h"
#include "deltaserve/kernels/repack.h"

namespace deltaserve::kernels::cuda {
namespace {

static_assert(kRowInterleave == 8, "the x8 block layouts of blocks.h");

// The inverse of repack_rows (kernels/cpu/repack.cpp): row r's block at one column takes its
// scale (and minimum) from d[r] (m[r]) and its quants 4 bytes at a time from qs[j][4r].
template <class Block, class Packed>
void unpack(const WeightMatrix& w, void* out) {
    constexpr int kWords = sizeof(Block::qs) / 4;
    const int64_t nb = w.cols / kQK;
    const auto* packed = static_cast<const Packed*>(w.data);
    auto* rows = static_cast<Block*>(out);
    for (int64_t g = 0; g < w.rows / 8; ++g) {
        for (int64_t b = 0; b < nb; ++b) {
            const Packed& in = packed[g * nb + b];
            for (int r = 0; r < 8; ++r) {
                Block& blk = rows[(8 * g + r) * nb + b];
                blk.d = in.d[r];
                if constexpr (requires { blk.m; }) blk.m = in.m[r];
                for (int j = 0; j < kWords; ++j) std::memcpy(&blk.qs[4 * j], &in.qs[j][4 * r], 4);
            }
        }
    }
}

}  // namespace

void deinterleave_rows(const WeightMatrix& w, void* out) {
    DS_CHECK(w.interleave == kRowInterleave && w.rows % kRowInterleave == 0,
             "deinterleave_rows: not an interleaved matrix");
    switch (w.type) {
        case DType::kQ4_0:
            unpack<BlockQ4_0, BlockQ4_0x8>(w, out);
            break;
        case DType::kQ4_1:
            unpack<BlockQ4_1, BlockQ4_1x8>(w, out);
            break;
        case DType::kQ8_0:
            unpack<BlockQ8_0, BlockQ8_0x8>(w, out);
            break;
        default:
            DS_CHECK(false, "deinterleave_rows: an interleaved matrix of an unknown type");
    }
}

}  // namespace deltaserve::kernels::cuda
