// Host side of upload_weight: an interleaved weight matrix (repack.h) back to ggml's
// row-major blocks, the only layout the device kernels read.
#pragma once

#include "deltaserve/kernels/dtype.h"

namespace deltaserve::kernels::cuda {

// Writes the rows of w (interleaved by repack_rows: rows a multiple of kRowInterleave) to
// out, row-major: w.rows * w.row_stride() bytes.
void deinterleave_rows(const WeightMatrix& w, void* out);

}  // namespace deltaserve::kernels::cuda
