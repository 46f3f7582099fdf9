// Host side of DeltaKV's ops on the "cuda" backend (latent_ops.cpp; compression in
// encode_ops.cpp): each checks its arguments (deltakv_ops.h's validate), stages the host lists
// (slots, latent rows, angle offsets, candidate counts) in one copy and enqueues deltakv.cu's
// or encode.cu's kernels on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "deltaserve/common/status.h"
#include "deltaserve/kernels/deltakv_ops.h"

namespace deltaserve::kernels::cuda {

Status run_deltakv_encode(const LatentEncodeInputs& in, const float* x, int64_t n,
                          const LatentEncodeOutputs& out, cudaStream_t stream);
Status run_max_head_scores(const AttentionShape& shape, const float* q, const PoolKeys& keys,
                           float* scores, cudaStream_t stream);
Status run_deltakv_pool_rows(const PoolRows& rows, float* out, cudaStream_t stream);
Status run_deltakv_key_scores(const AttentionShape& shape, const LatentRows& lat,
                              const LatentDecodeInputs& in, const float* q, float* scores,
                              int64_t lds, uint8_t* codes, cudaStream_t stream);
Status run_deltakv_reconstruct(const AttentionShape& shape, const LatentRows& lat,
                               const LatentDecodeInputs& in, uint8_t* k_out, uint8_t* v_out,
                               size_t out_stride, cudaStream_t stream);
Status run_latent_attention(const AttentionShape& shape, const LatentRows& lat, const float* scores,
                            const LatentValueInputs& in, float* out, float* lse,
                            cudaStream_t stream);
Status run_merge_attention(float* out, float* lse, const float* out_b, const float* lse_b,
                           int n_rows, int head_dim, cudaStream_t stream);

}  // namespace deltaserve::kernels::cuda
