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
struct BlockQ6_K {
    uint8_t ql[kQKK / 2];
    uint8_t qh[kQKK / 4];
    int8_t scales[kQKK / 16];
    uint16_t d;
};
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ6_K) == 210);

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
static_assert(sizeof(BlockQ4_0x8) == 8 * sizeof(BlockQ4_0));
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

}  // namespace deltaserve::kernels
