// Private to kernels/cpu: the CPU backend the registry is seeded with (cpu_backend.cpp).
#pragma once

#include <memory>

#include "deltaserve/kernels/backend.h"

namespace deltaserve::kernels {

std::unique_ptr<Backend> make_cpu_backend();

// Its DeltaKV ops (cpu_backend_deltakv.cpp), on the pool's threads.
Status cpu_max_head_scores(const AttentionShape& shape, const float* q, const PoolKeys& keys,
                           float* scores, ThreadPool& pool);
Status cpu_deltakv_encode(const LatentEncodeInputs& in, const float* x, int64_t n,
                          const LatentEncodeOutputs& out, ThreadPool& pool);
Status cpu_deltakv_pool_rows(const PoolRows& rows, float* out, ThreadPool& pool);
Status cpu_deltakv_key_scores(const AttentionShape& shape, const LatentRows& lat,
                              const LatentDecodeInputs& in, const float* q, float* scores,
                              int64_t lds, uint8_t* codes, ThreadPool& pool);
Status cpu_deltakv_reconstruct(const LatentRows& lat, const LatentDecodeInputs& in, uint8_t* k_out,
                               uint8_t* v_out, size_t out_stride, ThreadPool& pool);
Status cpu_latent_attention(const AttentionShape& shape, const LatentRows& lat, const float* scores,
                            const LatentValueInputs& in, float* out, float* lse, ThreadPool& pool);

}  // namespace deltaserve::kernels
