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
