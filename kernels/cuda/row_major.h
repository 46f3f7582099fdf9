// Host side of upload_weight: an interleaved weight matrix (repack.h) back to ggml's
// row-major blocks, the only layout the device kernels read.
#pragma once

#include "deltaserve/kernels/dtype.h"

namespace deltaserve::kernels::cuda {

// Writes the rows of w (interleave kRowInterleave: Q4_0, Q4_1 or Q8_0, rows a multiple of
// kRowInterleave) to out, row-major: w.rows * w.row_stride() bytes.
void deinterleave_rows(const WeightMatrix& w, void* out);

}  // namespace deltaserve::kernels::cuda
