// Which attention shapes the CPU kernels take, asked before a model runs: a model whose
// shape they cannot run is refused with an error when a context is made for it, instead of
// stopping the process at its first token (attention() checks the same as an invariant).
#pragma once

#include "deltaserve/common/status.h"
#include "deltaserve/kernels/attention.h"

namespace deltaserve::kernels {

// OK when attention() takes the shape: head_dim a positive multiple of 8 up to 256, n_kv_heads
// positive and dividing n_heads, at most 48 query heads per KV head. kUnimplemented naming
// the value otherwise.
Status attention_shape_supported(const AttentionShape& shape);

}  // namespace deltaserve::kernels
