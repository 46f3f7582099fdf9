// DeltaKV as a Backend's ops take it (backend.h): one sparse layer's compression of new
// tokens, its reference rows, its latent tokens' keys and scores or whole rows, and
// attention through their latents (deltakv.h has the math). Arrays live in
// the backend's memory; index lists (slots, latent rows, angle offsets) in host memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "deltaserve/common/status.h"
#include "deltaserve/kernels/attention.h"
#include "deltaserve/kernels/deltakv.h"
#include "deltaserve/kernels/dtype.h"

namespace deltaserve::kernels {

// The reference ordinal a latent names where it has none.
inline constexpr uint16_t kNoLatentRef = 0xFFFF;

// RoPE's cos and sin per position, for rows at many positions: position i's angles are
// head_dim floats (head_dim / 2 cosines, then as many sines, as rope_angles writes them) at
// table + at[i]; RoPE turns the first n_heads heads of a row.
struct RopeAngles {
    const float* table = nullptr;  // backend memory
    const int32_t* at = nullptr;   // host memory, one offset per row
    int n_heads = 0, head_dim = 0;
    RopeStyle style = RopeStyle::kInterleaved;
};

// Rows of a slot pool (fp16, row_stride bytes apart, all KV heads) as x: row i of out is the K
// row of slots[i] turned back before RoPE (rope_apply's inverse with angles.at[i]), then,
// when v is given, its V row. width: the values of a K row (n_kv_heads * head_dim).
struct PoolRows {
    const uint8_t* k = nullptr;
    const uint8_t* v = nullptr;  // nullptr: K only
    size_t row_stride = 0;
    const int32_t* slots = nullptr;  // host memory
    int64_t n = 0;
    int width = 0;
    RopeAngles angles;
};

// n latent tokens of one sparse layer: token i is row rows[i] of the layer's latents
// (int4_pack's format or m fp16 values, stride bytes apart) and names the references
// refs[rows[i] * k .. + k) (ordinals, kNoLatentRef for none).
struct LatentRows {
    int64_t n = 0;
    const int32_t* rows = nullptr;  // host memory
    const uint8_t* latents = nullptr;
    size_t stride = 0;
    int m = 0;
    const uint16_t* refs = nullptr;
    int k = 0;         // at most 16
    bool int4 = true;  // else m fp16 values (latent_attention only)
};

// What Backend::deltakv_key_scores and deltakv_reconstruct read besides the latents: the
// int4 decoder (its K rows for key scores, all of Dec for reconstruction), the references'
// rows by ordinal (PoolRows' output: K before RoPE, then V for reconstruction; dec.d values
// each), and each token's RoPE angles.
struct LatentDecodeInputs {
    Int4DecoderRef dec;
    const float* ref_x = nullptr;
    int64_t n_refs = 0;
    RopeAngles angles;  // one offset per token
};

// What Backend::latent_attention reads besides the latents and their scores: the codes
// deltakv_key_scores left (int4_code_stride(m) bytes per token; nullptr: unpacked again),
// the decoder's V rows ([n_kv_heads * head_dim][m], fp32), and the references' V rows,
// reference r at slot ref_slots[r] of a pool of fp16 rows.
struct LatentValueInputs {
    const uint8_t* codes = nullptr;
    const float* wd_v = nullptr;
    const uint8_t* ref_v = nullptr;
    size_t ref_stride = 0;
    const int32_t* ref_slots = nullptr;  // host memory
    int64_t n_refs = 0;
};

// K rows of a slot pool (fp16, all KV heads, row_stride bytes apart): row i at slots[i].
struct PoolKeys {
    const uint8_t* k = nullptr;
    size_t row_stride = 0;
    const int32_t* slots = nullptr;  // host memory
    int64_t n = 0;
};

// What Backend::deltakv_encode reads besides the tokens' rows: the layer's compressor (its
// matrices as upload_weight returns them) and the reference rows (dec.d = D floats each, K
// before RoPE then V, by ordinal); token i's candidates are the first n_cand[i] of them.
struct LatentEncodeInputs {
    const DeltaKvLayer* w = nullptr;
    const float* ref_x = nullptr;
    int64_t n_refs = 0;
    const int32_t* n_cand = nullptr;  // host memory, one per token, in [0, n_refs]
    int k = 0;                        // references per token, 1 to 16
};

// What deltakv_encode writes for token i (backend memory): refs[i * k ..] the ordinals of its
// nearest candidates (kNoLatentRef past the candidates it has), rm row i their mean (D
// floats), z row i its latent (m floats) and latents row i the latent as stored (stride bytes
// apart: int4_pack's format, or m fp16 values).
struct LatentEncodeOutputs {
    uint16_t* refs = nullptr;
    float* rm = nullptr;
    float* z = nullptr;
    uint8_t* latents = nullptr;
    size_t stride = 0;
    bool int4 = true;
};

// kInvalidArgument naming what breaks the ops' limits: rows without their lists, rows
// closer than their size, RoPE over more than a row, more than 16 references, m outside
// [1, kMaxLatent], a decoder of another shape, an attention shape the ops do not take.
// Backends check their arguments with these before they read them.
Status validate(const PoolRows& rows);
// For max_head_scores: the shape's heads over rows of its KV heads' width.
Status validate(const AttentionShape& shape, const PoolKeys& keys);
// kInvalidArgument naming op when there is work (n > 0) and one of an op's arrays is null.
Status need_arrays(const char* op, int64_t n, std::initializer_list<const void*> arrays);
// For deltakv_key_scores (`whole` false: dec holds the K rows) or deltakv_reconstruct
// (`whole`: all of Dec).
Status validate(const AttentionShape& shape, const LatentRows& lat, const LatentDecodeInputs& in,
                bool whole);
Status validate(const AttentionShape& shape, const LatentRows& lat, const LatentValueInputs& in);
// For deltakv_encode of n tokens (each n_cand is read).
Status validate(const LatentEncodeInputs& in, const float* x, int64_t n,
                const LatentEncodeOutputs& out);

}  // namespace deltaserve::kernels
