#include "row_major.h"

#include "deltaserve/kernels/repack.h"

namespace deltaserve::kernels::cuda {

// repack_rows' inverse lives beside it (kernels/cpu/repack.cpp), for every type it packs.
void deinterleave_rows(const WeightMatrix& w, void* out) { (void)unpack_rows(w, out); }

}  // namespace deltaserve::kernels::cuda
