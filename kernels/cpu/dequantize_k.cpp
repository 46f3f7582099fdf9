#include "dequantize_k.h"

#include "deltaserve/common/fp16.h"

namespace deltaserve::kernels {

namespace {

// d * q - m as ggml computes it. Every product in these formats is exact in fp32 (an fp16
// scale's 11 bits times a sub-block scale and a quant of 24 bits at most), so the one
// rounding is the difference's, and g++'s FMA contraction cannot change the bits.
inline float mul_sub(float a, float b, float c) { return a * b - c; }

}  // namespace

void dequantize_q2_k(const BlockQ2_K* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float d = fp16_to_fp32(b[i].d);
        const float dmin = fp16_to_fp32(b[i].dmin);
        const uint8_t* q = b[i].qs;
        int is = 0;
        for (int half = 0; half < 2; ++half, q += 32) {
            for (int shift = 0; shift < 8; shift += 2) {
                for (int part = 0; part < 2; ++part) {
                    const uint8_t sc = b[i].scales[is++];
                    const float dl = d * static_cast<float>(sc & 0xF);
                    const float ml = dmin * static_cast<float>(sc >> 4);
                    for (int l = 0; l < 16; ++l) {
                        const int v = (q[l + 16 * part] >> shift) & 3;
                        *y++ = mul_sub(dl, static_cast<float>(v), ml);
                    }
                }
            }
        }
    }
}

void dequantize_q3_k(const BlockQ3_K* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float d = fp16_to_fp32(b[i].d);
        const uint8_t* q = b[i].qs;
        const uint8_t* hm = b[i].hmask;
        int is = 0;
        uint8_t m = 1;
        for (int half = 0; half < 2; ++half, q += 32) {
            for (int shift = 0; shift < 8; shift += 2, m <<= 1) {
                for (int part = 0; part < 2; ++part) {
                    const float dl = d * static_cast<float>(scale_q3_k(is++, b[i].scales));
                    for (int l = 16 * part; l < 16 * part + 16; ++l) {
                        const int v = ((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4);
                        *y++ = dl * static_cast<float>(v);
                    }
                }
            }
        }
    }
}

void dequantize_q4_k(const BlockQ4_K* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float d = fp16_to_fp32(b[i].d);
        const float dmin = fp16_to_fp32(b[i].dmin);
        const uint8_t* q = b[i].qs;
        for (int j = 0; j < 8; j += 2, q += 32) {
            int sc, m;
            scale_min_k4(j, b[i].scales, &sc, &m);
            const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
            scale_min_k4(j + 1, b[i].scales, &sc, &m);
            const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
            for (int l = 0; l < 32; ++l) *y++ = mul_sub(d1, static_cast<float>(q[l] & 0xF), m1);
            for (int l = 0; l < 32; ++l) *y++ = mul_sub(d2, static_cast<float>(q[l] >> 4), m2);
        }
    }
}

void dequantize_q5_k(const BlockQ5_K* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float d = fp16_to_fp32(b[i].d);
        const float dmin = fp16_to_fp32(b[i].dmin);
        const uint8_t* ql = b[i].qs;
        const uint8_t* qh = b[i].qh;
        uint8_t u1 = 1, u2 = 2;
        for (int j = 0; j < 8; j += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
            int sc, m;
            scale_min_k4(j, b[i].scales, &sc, &m);
            const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
            scale_min_k4(j + 1, b[i].scales, &sc, &m);
            const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
            for (int l = 0; l < 32; ++l) {
                const int v = (ql[l] & 0xF) + ((qh[l] & u1) ? 16 : 0);
                *y++ = mul_sub(d1, static_cast<float>(v), m1);
            }
            for (int l = 0; l < 32; ++l) {
                const int v = (ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0);
                *y++ = mul_sub(d2, static_cast<float>(v), m2);
            }
        }
    }
}

void dequantize_q6_k(const BlockQ6_K* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float d = fp16_to_fp32(b[i].d);
        const uint8_t* ql = b[i].ql;
        const uint8_t* qh = b[i].qh;
        const int8_t* sc = b[i].scales;
        for (int half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; ++l) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
                y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
                y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
                y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
            }
        }
    }
}

void dequantize_iq4_xs(const BlockIQ4_XS* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float d = fp16_to_fp32(b[i].d);
        const uint8_t* qs = b[i].qs;
        for (int ib = 0; ib < 8; ++ib, qs += 16, y += 32) {
            const float dl = d * static_cast<float>(scale_iq4_xs(ib, b[i]));
            for (int j = 0; j < 16; ++j) {
                y[j] = dl * static_cast<float>(kIQ4Values[qs[j] & 0xF]);
                y[j + 16] = dl * static_cast<float>(kIQ4Values[qs[j] >> 4]);
            }
        }
    }
}

}  // namespace deltaserve::kernels
