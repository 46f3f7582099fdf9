#include "deltaserve/kernels/repack.h"

#include <cstring>

#include "blocks.h"
#include "deltaserve/common/status.h"
#include "deltaserve/kernels/quant.h"

namespace deltaserve::kernels {

namespace {

static_assert(kRowInterleave == 8, "the x8 block layouts of blocks.h");

// Row r's bytes of one quant array into an interleaved one (4 bytes per row per word), and
// back.
template <size_t kBytes>
void interleave_row(const uint8_t (&row)[kBytes], int r, uint8_t (*packed)[32]) {
    for (size_t j = 0; j < kBytes / 4; ++j) std::memcpy(&packed[j][4 * r], &row[4 * j], 4);
}
template <size_t kBytes>
void deinterleave_row(const uint8_t (*packed)[32], int r, uint8_t (&row)[kBytes]) {
    for (size_t j = 0; j < kBytes / 4; ++j) std::memcpy(&row[4 * j], &packed[j][4 * r], 4);
}

// Q4_K's 12 bytes of scales and minimums, as 16 values of 6 bits (8 scales, 8 minimums), and
// back: a bijection (12 bytes, 16 x 6 bits).
void split_scales_k4(const uint8_t* q, int (&v)[16]) {
    for (int j = 0; j < 8; ++j) scale_min_k4(j, q, &v[j], &v[8 + j]);
}
void join_scales_k4(const int (&v)[16], uint8_t* q) {
    for (int j = 0; j < 4; ++j) {
        q[j] = static_cast<uint8_t>(v[j] | ((v[j + 4] >> 4) << 6));
        q[j + 4] = static_cast<uint8_t>(v[8 + j] | ((v[8 + j + 4] >> 4) << 6));
        q[j + 8] = static_cast<uint8_t>((v[j + 4] & 0xF) | ((v[8 + j + 4] & 0xF) << 4));
    }
}

// The interleaved block of 8 rows' blocks at one column, and back. Row blocks and
// interleaved blocks are laid out as blocks.h describes.
template <class Block, class Packed>
void pack_block(const Block* const* rows, int64_t b, Packed& out) {
    for (int r = 0; r < 8; ++r) {
        const Block& blk = rows[r][b];
        out.d[r] = blk.d;
        if constexpr (requires { blk.m; }) out.m[r] = blk.m;
        if constexpr (requires { blk.dmin; }) out.dmin[r] = blk.dmin;
        if constexpr (requires { out.scales_lo; }) {
            int v[16];
            split_scales_k4(blk.scales, v);
            for (int p = 0; p < 8; ++p)
                out.scales_lo[p][r] =
                    static_cast<uint8_t>((v[2 * p] & 0xF) | ((v[2 * p + 1] & 0xF) << 4));
            for (int q = 0; q < 4; ++q) {
                int hi = 0;
                for (int i = 0; i < 4; ++i) hi |= (v[4 * q + i] >> 4) << (2 * i);
                out.scales_hi[q][r] = static_cast<uint8_t>(hi);
            }
        }
        if constexpr (requires { blk.ql; }) {
            for (int k = 0; k < 16; ++k) out.scales[k][r] = blk.scales[k];
            interleave_row(blk.ql, r, out.ql);
            interleave_row(blk.qh, r, out.qh);
        } else {
            interleave_row(reinterpret_cast<const uint8_t(&)[sizeof(blk.qs)]>(blk.qs), r,
                           reinterpret_cast<uint8_t(*)[32]>(out.qs));
        }
    }
}

template <class Block, class Packed>
void unpack_block(const Packed& in, int r, Block& out) {
    out.d = in.d[r];
    if constexpr (requires { out.m; }) out.m = in.m[r];
    if constexpr (requires { out.dmin; }) out.dmin = in.dmin[r];
    if constexpr (requires { in.scales_lo; }) {
        int v[16];
        for (int i = 0; i < 16; ++i) {
            const int lo = (in.scales_lo[i / 2][r] >> (4 * (i % 2))) & 0xF;
            const int hi = (in.scales_hi[i / 4][r] >> (2 * (i % 4))) & 3;
            v[i] = lo | (hi << 4);
        }
        join_scales_k4(v, out.scales);
    }
    if constexpr (requires { out.ql; }) {
        for (int k = 0; k < 16; ++k) out.scales[k] = in.scales[k][r];
        deinterleave_row(in.ql, r, out.ql);
        deinterleave_row(in.qh, r, out.qh);
    } else {
        deinterleave_row(reinterpret_cast<const uint8_t(*)[32]>(in.qs), r,
                         reinterpret_cast<uint8_t(&)[sizeof(out.qs)]>(out.qs));
    }
}

// Blocks per row of w.
int64_t blocks_per_row(const WeightMatrix& w) { return w.cols / dtype_traits(w.type).block_elems; }

template <class Block, class Packed>
void repack(const WeightMatrix& w, void* out) {
    const int64_t nb = blocks_per_row(w);
    auto* dst = static_cast<Packed*>(out);
    for (int64_t g = 0; g < w.rows / 8; ++g) {
        const Block* rows[8];
        for (int r = 0; r < 8; ++r) rows[r] = reinterpret_cast<const Block*>(w.row(8 * g + r));
        for (int64_t b = 0; b < nb; ++b) pack_block(rows, b, dst[g * nb + b]);
    }
}

template <class Block, class Packed>
void unpack(const WeightMatrix& w, void* out) {
    const int64_t nb = blocks_per_row(w);
    const auto* packed = static_cast<const Packed*>(w.data);
    auto* rows = static_cast<Block*>(out);
    for (int64_t g = 0; g < w.rows / 8; ++g) {
        for (int64_t b = 0; b < nb; ++b) {
            for (int r = 0; r < 8; ++r)
                unpack_block(packed[g * nb + b], r, rows[(8 * g + r) * nb + b]);
        }
    }
}

template <class Block, class Packed>
void dequantize_interleaved(const WeightMatrix& w, int64_t r, float* dst) {
    const int64_t nb = blocks_per_row(w);
    const int n = dtype_traits(w.type).block_elems;
    const Packed* group = static_cast<const Packed*>(w.data) + (r / 8) * nb;
    Block blk;
    for (int64_t b = 0; b < nb; ++b) {
        unpack_block(group[b], static_cast<int>(r % 8), blk);
        dequantize_row(w.type, &blk, dst + b * n, n);
    }
}

}  // namespace

bool repackable(const WeightMatrix& w) {
    const bool type = w.type == DType::kQ4_0 || w.type == DType::kQ4_1 || w.type == DType::kQ8_0 ||
                      w.type == DType::kQ4_K || w.type == DType::kQ6_K;
    return type && w.interleave == 1 && w.rows > 0 && w.rows % kRowInterleave == 0 &&
           w.cols % dtype_traits(w.type).block_elems == 0;
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
        case DType::kQ4_K:
            repack<BlockQ4_K, BlockQ4_Kx8>(w, out);
            break;
        case DType::kQ6_K:
            repack<BlockQ6_K, BlockQ6_Kx8>(w, out);
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

WeightMatrix unpack_rows(const WeightMatrix& w, void* out) {
    DS_CHECK(w.interleave == kRowInterleave && w.rows % kRowInterleave == 0,
             "unpack_rows: not an interleaved matrix");
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
        case DType::kQ4_K:
            unpack<BlockQ4_K, BlockQ4_Kx8>(w, out);
            break;
        case DType::kQ6_K:
            unpack<BlockQ6_K, BlockQ6_Kx8>(w, out);
            break;
        default:
            DS_CHECK(false, "unpack_rows: an interleaved matrix of an unknown type");
    }
    WeightMatrix rows = w;
    rows.data = out;
    rows.interleave = 1;
    return rows;
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
        case DType::kQ4_K:
            dequantize_interleaved<BlockQ4_K, BlockQ4_Kx8>(w, r, dst);
            break;
        case DType::kQ6_K:
            dequantize_interleaved<BlockQ6_K, BlockQ6_Kx8>(w, r, dst);
            break;
        default:
            DS_CHECK(false, "dequantize_weight_row: an interleaved matrix of an unknown type");
    }
}

}  // namespace deltaserve::kernels
