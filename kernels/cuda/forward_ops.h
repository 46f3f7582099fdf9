// Host side of the forward pass's ops on the "cuda" backend (forward_ops.cpp): each checks
// its arguments (kInvalidArgument naming the op), stages the host arrays the interface
// passes (positions, tokens, slot lists, top_k's results) and enqueues its kernels on
// `stream`. CudaBackend (cuda_backend.cpp) has checked for a device and resolved the stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>

#include "deltaserve/common/status.h"
#include "deltaserve/kernels/attention.h"
#include "deltaserve/kernels/backend.h"
#include "deltaserve/kernels/dtype.h"
#include "deltaserve/kernels/matmul.h"
#include "deltaserve/kernels/ops.h"

namespace deltaserve::kernels::cuda {

// OK when upload_weight takes w: a type the kernels read, cols > 0 (a multiple of 32 for the
// quantized types), rows in [0, INT32_MAX], row-major or interleaved by repack_rows.
Status check_upload(const WeightMatrix& w);

Status run_matmul(const WeightMatrix& w, const float* x, int64_t ldx, int64_t n, float* y,
                  int64_t ldy, cudaStream_t stream);
Status run_matmul_shared_input(std::span<const MatmulOutput> outputs, const float* x, int64_t ldx,
                               int64_t n, cudaStream_t stream);
Status run_rms_norm_rows(const float* x, int64_t ldx, const float* weight, int64_t d, int64_t n,
                         float eps, float* out, int64_t ldo, cudaStream_t stream);
Status run_rope_rows(float* x, int64_t ldx, int64_t n, int n_heads, int head_dim,
                     const int32_t* positions, const RopeParams& rope, cudaStream_t stream);
Status run_silu_mul(float* out, const float* gate, const float* up, int64_t n, cudaStream_t stream);
Status run_add(float* y, const float* x, int64_t n, cudaStream_t stream);
Status run_gelu_mul(float* out, const float* gate, const float* up, int64_t n, cudaStream_t stream);
Status run_scale(float* x, float s, int64_t n, cudaStream_t stream);
Status run_embed_rows(const WeightMatrix& table, const int32_t* tokens, int64_t n, float* out,
                      cudaStream_t stream);
Status run_store_rows(DType dtype, int64_t width, const float* src, int64_t ld, int64_t n,
                      uint8_t* dst, size_t row_stride, const int32_t* slots, cudaStream_t stream);
Status run_copy_rows(uint8_t* dst, size_t dst_stride, const int32_t* dst_rows, const uint8_t* src,
                     size_t src_stride, const int32_t* src_rows, size_t row_bytes, int64_t n,
                     cudaStream_t stream);
Status run_attention(const AttentionShape& shape, const KvView& kv, const float* q, int64_t ldq,
                     int32_t n_q, float* out, int64_t ldo, cudaStream_t stream);
// run_attention with each row's lse ([n_q][n_heads]); not causal: every query sees every
// entry.
Status run_attention_lse(const AttentionShape& shape, const KvView& kv, const float* q, int64_t ldq,
                         int32_t n_q, float* out, int64_t ldo, float* lse, bool causal,
                         cudaStream_t stream);
// The jobs of one pool in one launch (views of several: one launch each).
Status run_attention_batch(const AttentionShape& shape, std::span<const AttentionJob> jobs,
                           const float* q, int64_t ldq, float* out, int64_t ldo,
                           cudaStream_t stream);
// Synchronizes the stream: ids and values are written when it returns.
Status run_top_k(const float* logits, int64_t n_vocab, int64_t n_rows, int32_t k, int32_t* ids,
                 float* values, cudaStream_t stream);

}  // namespace deltaserve::kernels::cuda
