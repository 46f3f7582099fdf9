// DeltaKV's per-token math (../shared/methods/deltakv.md section 2) for one layer's
// compressor: x = [K (pre-RoPE); V], all KV heads, D = 2 * kv_dim values per token.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "deltaserve/common/thread_pool.h"
#include "deltaserve/kernels/attention.h"
#include "deltaserve/kernels/dtype.h"
#include "deltaserve/kernels/ops.h"

namespace deltaserve::kernels {

// One layer's compressor, fp32 row-major: E(x) = W3 (SiLU(W1 x) * (W2 x)) (D -> hidden ->
// m) and Dec(z) = Wd z (m -> D, no bias).
struct DeltaKvLayer {
    WeightMatrix w1, w2;  // hidden x D
    WeightMatrix w3;      // m x hidden
    WeightMatrix wd;      // D x m
    int d() const { return static_cast<int>(w1.cols); }
    int m() const { return static_cast<int>(w3.rows); }
};

// z[i] = E(x[i]) - E(r[i]) for n rows (x, r: [n][D]; z: [n][m]). scratch holds
// 2 * n * hidden floats.
void deltakv_encode_residual(const DeltaKvLayer& w, const float* x, const float* r, int64_t n,
                             float* z, float* scratch, ThreadPool& pool);

// x^ = Dec(z) + r for one token (z: m floats, r and out: D floats), in fp32: the
// straightforward version (the cache decodes int4 latents with deltakv_decode_int4).
void deltakv_decode(const DeltaKvLayer& w, const float* z, const float* r, float* out);

// x += the mean of n rows of dims values (nothing when n is 0): a latent token's references,
// added in one pass.
void add_mean_rows(float* x, const float* const* rows, int n, int dims);

// Indices (into cands, [n][D] rows) of the k rows nearest to x by L2, ascending distance;
// k is clamped to n. Returns how many were written.
int l2_nearest(const float* x, const float* cands, int n, int d, int k, int32_t* out);

// Latents stored as 4-bit integers with a per-token fp16 scale and minimum (min/max
// quantisation, KIVI-style): int4_bytes(m) bytes per token.
size_t int4_bytes(int m);
void int4_pack(const float* z, int m, uint8_t* out);
void int4_unpack(const uint8_t* in, int m, float* z);

// Bytes between tokens' codes as the int4 kernels read them: m rounded up to 16.
inline int int4_code_stride(int m) { return (m + 15) / 16 * 16; }
// The codes (0..15) of n int4 latents, one byte each, int4_code_stride(m) apart, zero past
// m: decoding and latent_attention can share one unpacking.
void int4_latent_codes(const uint8_t* const* latents, int64_t n, int m, uint8_t* codes);

// A layer's decoder for int4 latents (int4_pack's format), made once per profile: Wd in
// int8 with one scale per output row, laid out four latent columns at a time for the
// integer dot-product instructions ([m16 / 4][d][4]), and each row's sum, which the latent's
// minimum multiplies: Dec(lo + s q)[r] = lo * row_sum[r] + s * scale[r] * (w8[r] . q).
// Kernels read it through an Int4DecoderRef: its own arrays (ref()) or a copy of them in a
// backend's memory (Backend::upload_int4_decoder).
struct Int4DecoderRef {
    int d = 0, m = 0, m16 = 0;
    const int8_t* w = nullptr;
    const float* scale = nullptr;
    const float* row_sum = nullptr;
};
struct Int4Decoder {
    int d = 0, m = 0, m16 = 0;  // m16: int4_code_stride(m) (zero columns past m)
    std::vector<int8_t> w;
    std::vector<float> scale, row_sum;
    Int4DecoderRef ref() const { return {d, m, m16, w.data(), scale.data(), row_sum.data()}; }
};
Int4Decoder make_int4_decoder(const DeltaKvLayer& w);
// The same for Wd's first `rows` rows only (the keys: a decode step reconstructs no values).
Int4Decoder make_int4_decoder(const DeltaKvLayer& w, int rows);
// out = dec's rows `rows[0..n_rows)`, in that order (a decoder of a few key dimensions;
// out's buffers are reused). Decoding with it gives those rows of dec's output: the same
// integer dot products, scaled alike (to the last bit where both take the same code path).
void int4_decoder_rows(const Int4Decoder& dec, const int32_t* rows, int n_rows, Int4Decoder& out);

// What deltakv_decode_int4 adds to token i's row and how it turns it, while the row is in
// registers: x += the mean of refs[i * k .. i * k + k) (rows of dec.d values; nullptr ones
// skipped), then RoPE (not inverse) on the first n_heads * head_dim values with the angles
// at angles[i] (cos, then sin; head_dim / 2 each, as rope_angles writes them).
struct Int4KeyFinish {
    const float* const* refs = nullptr;
    int k = 0;
    const float* const* angles = nullptr;
    int n_heads = 0, head_dim = 0;
    RopeStyle style = RopeStyle::kInterleaved;
};

// out[i * ldo + r] = Dec(int4_unpack(latents[i]))[r] for n tokens, on the calling thread
// (callers split the tokens and use the rows while they are in cache). The dot products
// of the codes with the int8 rows are exact integers, so every ISA gives the same bits; the
// error against the fp32 decoder is Wd's int8 rounding (at most scale[r] / 2 per weight).
// With `codes` (int4_latent_codes of the same latents) the codes are not unpacked again.
// With `finish` each decoded row then gets its references' mean and RoPE in the same pass
// (Int4KeyFinish): the bits add_mean_rows and rope_apply give after it.
void deltakv_decode_int4(const Int4DecoderRef& dec, const uint8_t* const* latents, int64_t n,
                         float* out, int64_t ldo, const uint8_t* codes = nullptr,
                         const Int4KeyFinish* finish = nullptr);
inline void deltakv_decode_int4(const Int4Decoder& dec, const uint8_t* const* latents, int64_t n,
                                float* out, int64_t ldo, const uint8_t* codes = nullptr,
                                const Int4KeyFinish* finish = nullptr) {
    deltakv_decode_int4(dec.ref(), latents, n, out, ldo, codes, finish);
}

inline constexpr int kMaxLatent = 512;  // the largest m latent_attention takes

// Tokens a decode step attends to without making their values: V = Dec_v(z) + the mean of
// the token's reference V rows. Dec is linear, so attention's sum_i p_i V_i =
// Dec_v(sum_i p_i z_i) + sum_r w_r V_r, where reference r's weight w_r gathers
// p_i / (references of i) from every token i that uses it: per head one m-vector and one
// decoder product instead of a D x m decode per token, and each reference row read once.
struct LatentTokens {
    int64_t n = 0;
    const float* scores = nullptr;  // [n_heads][n]: scale * q[h] . k_i (keys reconstructed)
    const uint8_t* const* latents = nullptr;  // [n] packed: int4_pack's format, or m fp16
    const uint8_t* codes = nullptr;           // optional, int4: int4_latent_codes of the latents
    bool int4 = true;
    int m = 0;
    const float* wd_v = nullptr;    // [n_kv_heads * head_dim][m]: the decoder's V rows
    const int32_t* refs = nullptr;  // [n][ref_slots] indices into ref_v, -1 for none
    int ref_slots = 0;
    const uint16_t* const* ref_v = nullptr;  // [n_refs] fp16 V rows (all KV heads)
    int64_t n_refs = 0;
};

// scores[h * lds + i] = scale * q[h] . k_i[h / (n_heads / n_kv_heads)] for n fp32 key rows
// holding every KV head (ldk floats apart). A key's score does not depend on its place in
// the rows (callers split tokens into blocks as their threads go).
void head_scores(const AttentionShape& s, const float* q, const float* k, int64_t ldk, int64_t n,
                 float* scores, int64_t lds);

// One query position over the tokens: out (n_heads * head_dim) = each head's attention,
// normalised over these tokens, and lse[h] as attention() gives it (merge_attention joins it
// with attention over the other tokens). Work is cut into fixed pieces summed in order: the
// same bits with any pool.
void latent_attention(const AttentionShape& s, const LatentTokens& t, float* out, float* lse,
                      ThreadPool& pool);

// OmniKV-style selection scores: for each of n tokens (fp16 K rows holding all KV heads),
// the max over query heads h of q[h] . k[h / (n_heads / n_kv_heads)].
void max_head_scores(const float* q, int n_heads, int n_kv_heads, int head_dim,
                     const uint16_t* const* k_rows, int64_t n, float* out, ThreadPool& pool);

// The attention n_q query rows give each of n tokens (fp16 K rows holding all KV heads),
// summed over the rows: out[h * n + t] += sum_i exp(scale * q_i[h] . k_t[h / group] +
// shift[i * n_heads + h]), shift being what turns a logit into the log of its share of the
// row's attention (minus the row's log-sum-exp, plus any correction of these tokens' logits).
void attention_mass(const float* q, int64_t ldq, int n_q, const float* shift, int n_heads,
                    int n_kv_heads, int head_dim, float scale, const uint16_t* const* k_rows,
                    int64_t n, float* out, ThreadPool& pool);

// RoPE's inverse: turns K after RoPE at pos back into K before it.
void rope_inverse(float* x, int n_heads, int head_dim, int64_t pos, float base, RopeStyle style);

// The cosines and sines RoPE uses at pos (head_dim / 2 of each, computed as rope() does), and
// RoPE or its inverse applied with them: for many tokens at few positions, the angles once.
void rope_angles(int64_t pos, int head_dim, float base, float* cos_out, float* sin_out);
void rope_apply(float* x, int n_heads, int head_dim, const float* c, const float* s,
                RopeStyle style, bool inverse);

}  // namespace deltaserve::kernels
