// Device side of DeltaKV's decode-step ops (deltakv.cu). Plain C++: deltakv_ops.cpp checks
// the arguments and stages the host lists; every pointer here is device memory.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace deltaserve::kernels::cuda {

// Where a row's RoPE angles are (RopeAngles): position i's cos at table + at[i], its sin
// half a head further.
struct AnglesLaunch {
    const float* table = nullptr;
    const int32_t* at = nullptr;
    int n_heads = 0;
    int head_dim = 0;
    bool interleaved = true;
};

// PoolRows: one block per row.
struct PoolRowsLaunch {
    const uint8_t* k = nullptr;
    const uint8_t* v = nullptr;  // nullptr: K only
    size_t row_stride = 0;
    const int32_t* slots = nullptr;
    int64_t n = 0;
    int width = 0;
    AnglesLaunch angles;
    float* out = nullptr;
};
cudaError_t launch_pool_rows(const PoolRowsLaunch& a, cudaStream_t stream);

// max_head_scores: a warp per row, the heads' dot products each summed across the warp.
struct HeadScoresLaunch {
    const float* q = nullptr;  // n_heads * head_dim
    int n_heads = 0;
    int n_kv_heads = 0;
    int head_dim = 0;
    const uint8_t* k = nullptr;
    size_t row_stride = 0;
    const int32_t* slots = nullptr;
    int64_t n = 0;
    float* scores = nullptr;
};
cudaError_t launch_max_head_scores(const HeadScoresLaunch& a, cudaStream_t stream);

// The latent tokens (LatentRows): token i is row rows[i] of latents and of refs.
struct LatentsLaunch {
    int64_t n = 0;
    const int32_t* rows = nullptr;
    const uint8_t* latents = nullptr;
    size_t stride = 0;
    int m = 0;
    int m16 = 0;  // int4_code_stride(m)
    const uint16_t* refs = nullptr;
    int k = 0;
    bool int4 = true;
};

// Where a latent token's row comes from: the int4 decoder's `rows` rows ([m16 / 4][rows][4]
// int8, a scale and a sum per row) and the references' rows (`rows` floats each, by
// ordinal), RoPE'd at the token's angles.
struct RowSource {
    const int8_t* dec_w = nullptr;
    const float* dec_scale = nullptr;
    const float* dec_row_sum = nullptr;
    int rows = 0;
    const float* ref_x = nullptr;
    AnglesLaunch angles;  // one offset per token
};

// deltakv_key_scores: one block per token decodes its key (src.rows = n_kv_heads *
// head_dim) into shared memory, then scores it with every head.
struct KeyScoresLaunch {
    LatentsLaunch lat;
    RowSource src;
    const float* q = nullptr;  // n_heads * head_dim
    int n_heads = 0;
    int n_kv_heads = 0;
    int head_dim = 0;
    float scale = 0.0f;
    float* scores = nullptr;  // [n_heads][lds]
    int64_t lds = 0;
    uint8_t* codes = nullptr;  // [n][m16]
};
cudaError_t launch_key_scores(const KeyScoresLaunch& a, cudaStream_t stream);

// deltakv_reconstruct: one block per token makes its whole row (src.rows = 2 * width: K, then
// V) in shared memory and writes K and V as fp16.
struct ReconstructLaunch {
    LatentsLaunch lat;
    RowSource src;
    uint8_t* k_out = nullptr;
    uint8_t* v_out = nullptr;
    size_t out_stride = 0;
};
cudaError_t launch_reconstruct(const ReconstructLaunch& a, cudaStream_t stream);

// latent_attention in three kernels: each head's softmax max and sum; per (head, piece of
// kLatentPiece tokens) the weighted latents and the weighted reference V rows; per head the
// pieces summed in order, the decoder's V rows applied, and the normalised output and lse.
inline constexpr int64_t kLatentPiece = 256;
struct LatentAttentionLaunch {
    LatentsLaunch lat;
    const float* scores = nullptr;   // [n_heads][n]
    const uint8_t* codes = nullptr;  // int4: [n][m16], or nullptr to unpack the latents
    const float* wd_v = nullptr;     // [n_kv_heads * head_dim][m]
    const uint8_t* ref_v = nullptr;
    size_t ref_stride = 0;
    const int32_t* ref_slots = nullptr;  // by ordinal
    int n_heads = 0;
    int n_kv_heads = 0;
    int head_dim = 0;
    float* out = nullptr;  // n_heads * head_dim
    float* lse = nullptr;  // n_heads
    // Scratch: head_stats 2 * n_heads floats; partial n_heads * pieces * (m + head_dim + 1).
    float* head_stats = nullptr;
    float* partial = nullptr;
};
inline int64_t latent_pieces(int64_t n) { return (n + kLatentPiece - 1) / kLatentPiece; }
cudaError_t launch_latent_attention(const LatentAttentionLaunch& a, cudaStream_t stream);

// kernels::merge_attention over n_rows rows.
cudaError_t launch_merge_attention(float* out, float* lse, const float* out_b, const float* lse_b,
                                   int n_rows, int head_dim, cudaStream_t stream);

}  // namespace deltaserve::kernels::cuda
