// Block layouts of the quantized formats (ggml's, byte for byte) and of the int8
// activation blocks the integer kernels consume. Private to kernels/.
#pragma once

#include <cstdint>

namespace deltaserve::kernels {

constexpr int kQK = 32;    // elements per 32-block
constexpr int kQKK = 256;  // elements per K-quant super-block

struct BlockQ4_0 {
    uint16_t d;
    uint8_t qs[kQK / 2];
};
struct BlockQ4_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qs[kQK / 2];
};
struct BlockQ8_0 {
    uint16_t d;
    int8_t qs[kQK];
};
// Q5_0 / Q5_1: bit j of qh (little-endian) is the fifth bit of element j.
struct BlockQ5_0 {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[kQK / 2];
};
struct BlockQ5_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qh[4];
    uint8_t qs[kQK / 2];
};
struct BlockIQ4_NL {
    uint16_t d;
    uint8_t qs[kQK / 2];  // indices into kIQ4Values, packed as Q4_0's
};
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockIQ4_NL) == 18);

// The K-quants: super-blocks of 256 with 16 or 8 sub-block scales (ggml-common.h).
struct BlockQ2_K {
    uint8_t scales[kQKK / 16];  // scale (low nibble) and min (high nibble) per 16
    uint8_t qs[kQKK / 4];
    uint16_t d;
    uint16_t dmin;
};
struct BlockQ3_K {
    uint8_t hmask[kQKK / 8];
    uint8_t qs[kQKK / 4];
    uint8_t scales[12];  // 16 scales of 6 bits
    uint16_t d;
};
struct BlockQ4_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];  // 8 scales and 8 mins of 6 bits
    uint8_t qs[kQKK / 2];
};
struct BlockQ5_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];
    uint8_t qh[kQKK / 8];
    uint8_t qs[kQKK / 2];
};
struct BlockQ6_K {
    uint8_t ql[kQKK / 2];
    uint8_t qh[kQKK / 4];
    int8_t scales[kQKK / 16];
    uint16_t d;
};
struct BlockIQ4_XS {
    uint16_t d;
    uint16_t scales_h;
    uint8_t scales_l[kQKK / 64];
    uint8_t qs[kQKK / 2];
};
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockIQ4_XS) == 136);

// The 16 values of IQ4_NL and IQ4_XS's 4-bit indices (ggml's kvalues_iq4nl).
inline constexpr int8_t kIQ4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                          1,    13,   25,  38,  53,  69,  89,  113};

// Scale j (< 8) and min j of a Q4_K / Q5_K block's 12 packed bytes (ggml's
// get_scale_min_k4).
inline void scale_min_k4(int j, const uint8_t* q, int* sc, int* m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Scale j (< 16) of a Q3_K block's 12 packed bytes, offset removed: -32..31.
inline int scale_q3_k(int j, const uint8_t* q) {
    const int lo = j < 8 ? q[j] & 0xF : q[j - 8] >> 4;
    const int hi = (q[8 + j % 4] >> (2 * (j / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}

// Scale j (< 8) of an IQ4_XS block, offset removed: -32..31.
inline int scale_iq4_xs(int j, const BlockIQ4_XS& b) {
    const int lo = (b.scales_l[j / 2] >> (4 * (j % 2))) & 0xF;
    const int hi = (b.scales_h >> (2 * j)) & 3;
    return (lo | (hi << 4)) - 32;
}

// The blocks of kRowInterleave (8) rows at one block column, as repack_rows stores them:
// the rows' scales (and minimums) in row order, then the quants 4 bytes per row:
// qs[j][4 * r + i] is byte 4 * j + i of row r's block. A Q4 byte holds elements i and i + 16
// in its low and high nibble, so qs[j] gives elements 4j..4j+3 (low nibbles) and
// 16+4j..16+4j+3 (high nibbles) of every row.
struct BlockQ4_0x8 {
    uint16_t d[8];
    uint8_t qs[4][32];
};
struct BlockQ4_1x8 {
    uint16_t d[8];
    uint16_t m[8];
    uint8_t qs[4][32];
};
struct BlockQ8_0x8 {
    uint16_t d[8];
    int8_t qs[8][32];
};
// Q4_K: the rows' 16 six-bit values (8 scales, then 8 minimums) split for the kernels to
// decode 8 rows at once: scales_lo[p][r] holds the low 4 bits of row r's values 2p (low
// nibble) and 2p + 1, scales_hi[q][r] the high 2 bits of values 4q .. 4q + 3 (bits 0-1 for
// 4q); the quants 4 bytes per row as above (qs[k] holds bytes 4k..4k+3 of every row's qs).
struct BlockQ4_Kx8 {
    uint16_t d[8];
    uint16_t dmin[8];
    uint8_t scales_lo[8][8];
    uint8_t scales_hi[4][8];
    uint8_t qs[32][32];
};
// Q6_K: scales[k][r] is row r's scale k (by scale, then row, for a vector load of 8 rows');
// ql and qh 4 bytes per row as above.
struct BlockQ6_Kx8 {
    uint16_t d[8];
    int8_t scales[16][8];
    uint8_t ql[32][32];
    uint8_t qh[16][32];
};
static_assert(sizeof(BlockQ4_0x8) == 8 * sizeof(BlockQ4_0));
static_assert(sizeof(BlockQ6_Kx8) == 8 * sizeof(BlockQ6_K));
static_assert(sizeof(BlockQ4_Kx8) == 8 * sizeof(BlockQ4_K));
static_assert(sizeof(BlockQ4_1x8) == 8 * sizeof(BlockQ4_1));
static_assert(sizeof(BlockQ8_0x8) == 8 * sizeof(BlockQ8_0));

// Activations quantized for the integer kernels: x[i] ~= d * qs[i]; s = d * sum(qs).
// d and s hold fp16-rounded values, as ggml's Q8_0/Q8_1 activation blocks do.
struct BlockQ8A {
    float d;
    float s;
    int8_t qs[kQK];
};

// Quantizes n floats (multiple of 32) into n/32 activation blocks.
void quantize_activations(const float* x, BlockQ8A* out, int64_t n);

// Activations of the K-quant and IQ4_XS kernels, ggml's block_q8_K: x[i] ~= d * qs[i] over
// 256 values with one fp32 scale; bsums[k] = sum of qs[16k .. 16k + 15], for the minimums
// and offsets of the weights' sub-blocks.
struct BlockQ8K {
    float d;
    int8_t qs[kQKK];
    int16_t bsums[kQKK / 16];
};
static_assert(sizeof(BlockQ8K) == 292);

// Quantizes n floats (multiple of 256) into n/256 blocks as ggml's quantize_row_q8_K.
void quantize_activations_q8k(const float* x, BlockQ8K* out, int64_t n);

}  // namespace deltaserve::kernels
