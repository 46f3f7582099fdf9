// Weights repacked at load for the matmul kernels, as ggml's CPU "repack" buffers do: the
// rows of a quantized matrix in groups of kRowInterleave, each group stored block by block
// with the group's scales together and its quants interleaved 4 bytes per row, so one
// 256-bit load holds the same 4 inputs of 8 rows and a product with one broadcast activation
// word gives 8 rows' partial sums. Every matmul (one token or many) then reads each weight
// block once per row group, and the results are the same bits as the row-major kernels'.
#pragma once

#include <cstdint>

#include "deltaserve/kernels/dtype.h"

namespace deltaserve::kernels {

constexpr int32_t kRowInterleave = 8;

// Whether repack_rows takes w: Q4_0, Q4_1, Q8_0, Q4_K or Q6_K, row-major, rows a multiple
// of kRowInterleave.
bool repackable(const WeightMatrix& w);

// Writes w's blocks, interleaved, to `out` (w.rows * w.row_stride() bytes, the size of w)
// and returns the matrix over them. w must be repackable.
WeightMatrix repack_rows(const WeightMatrix& w, void* out);

// The inverse of repack_rows: writes interleaved w's rows, row-major, to `out` (the size of
// w) and returns the matrix over them (a backend that reads only row-major blocks).
WeightMatrix unpack_rows(const WeightMatrix& w, void* out);

// dst[0..w.cols) = row r of w, in either layout.
void dequantize_weight_row(const WeightMatrix& w, int64_t r, float* dst);

}  // namespace deltaserve::kernels
