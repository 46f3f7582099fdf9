#include "deltaserve/kernels/deltakv.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "deltaserve/common/fp16.h"
#include "deltaserve/kernels/matmul.h"

namespace deltaserve::kernels {

void deltakv_encode_residual(const DeltaKvLayer& w, const float* x, const float* r, int64_t n, float* z,
                             float* scratch, ThreadPool& pool) {
    const int64_t d = w.d(), h = w.w1.rows, m = w.m();
    float* a = scratch;
    float* b = scratch + n * h;
    std::vector<float> ez(static_cast<size_t>(n * m));
    for (int pass = 0; pass < 2; ++pass) {
        const float* in = pass == 0 ? x : r;
        const MatmulOutput ab[] = {{&w.w1, a, h}, {&w.w2, b, h}};
        matmul_shared_input(ab, in, d, n, pool);
        for (int64_t i = 0; i < n * h; ++i) a[i] = a[i] / (1.0f + std::exp(-a[i])) * b[i];
        matmul(w.w3, a, h, n, pass == 0 ? z : ez.data(), m, pool);
    }
    for (int64_t i = 0; i < n * m; ++i) z[i] -= ez[i];
}

void deltakv_decode(const DeltaKvLayer& w, const float* z, const float* r, float* out) {
    const int d = w.d(), m = w.m();
    const auto* wd = static_cast<const float*>(w.wd.data);
    for (int i = 0; i < d; ++i) {
        const float* row = wd + static_cast<size_t>(i) * m;
        float acc = 0.0f;
        for (int j = 0; j < m; ++j) acc += row[j] * z[j];
        out[i] = acc + r[i];
    }
}

int l2_nearest(const float* x, const float* cands, int n, int d, int k, int32_t* out) {
    k = std::min(k, n);
    std::vector<std::pair<float, int32_t>> dist(static_cast<size_t>(n));
    for (int c = 0; c < n; ++c) {
        const float* y = cands + static_cast<size_t>(c) * d;
        float s = 0.0f;
        for (int i = 0; i < d; ++i) {
            const float t = x[i] - y[i];
            s += t * t;
        }
        dist[c] = {s, c};
    }
    std::partial_sort(dist.begin(), dist.begin() + k, dist.end());
    for (int i = 0; i < k; ++i) out[i] = dist[i].second;
    return k;
}

size_t int4_bytes(int m) { return static_cast<size_t>((m + 1) / 2) + 4; }

void int4_pack(const float* z, int m, uint8_t* out) {
    float lo = z[0], hi = z[0];
    for (int i = 1; i < m; ++i) {
        lo = std::min(lo, z[i]);
        hi = std::max(hi, z[i]);
    }
    const uint16_t lo16 = fp32_to_fp16(lo);
    const float lo_r = fp16_to_fp32(lo16);
    const uint16_t s16 = fp32_to_fp16((hi - lo_r) / 15.0f);
    const float s = fp16_to_fp32(s16);
    const float inv = s > 0.0f ? 1.0f / s : 0.0f;
    std::memcpy(out, &s16, 2);
    std::memcpy(out + 2, &lo16, 2);
    uint8_t* q = out + 4;
    std::memset(q, 0, static_cast<size_t>((m + 1) / 2));
    for (int i = 0; i < m; ++i) {
        const int v = std::clamp(static_cast<int>(std::lround((z[i] - lo_r) * inv)), 0, 15);
        q[i / 2] |= static_cast<uint8_t>(i % 2 == 0 ? v : v << 4);
    }
}

void int4_unpack(const uint8_t* in, int m, float* z) {
    uint16_t s16, lo16;
    std::memcpy(&s16, in, 2);
    std::memcpy(&lo16, in + 2, 2);
    const float s = fp16_to_fp32(s16), lo = fp16_to_fp32(lo16);
    const uint8_t* q = in + 4;
    for (int i = 0; i < m; ++i) z[i] = lo + s * static_cast<float>(i % 2 == 0 ? q[i / 2] & 15 : q[i / 2] >> 4);
}

void rope_angles(int64_t pos, int head_dim, float base, float* c, float* s) {
    const float theta_scale = std::pow(base, -2.0f / static_cast<float>(head_dim));
    float theta = static_cast<float>(pos);
    for (int j = 0; j < head_dim / 2; ++j) {
        c[j] = std::cos(theta);
        s[j] = std::sin(theta);
        theta *= theta_scale;
    }
}

void rope_apply(float* x, int n_heads, int head_dim, const float* c, const float* s, RopeStyle style, bool inverse) {
    const int half = head_dim / 2;
    const float sign = inverse ? -1.0f : 1.0f;
    for (int hd = 0; hd < n_heads; ++hd) {
        float* v = x + static_cast<int64_t>(hd) * head_dim;
        for (int j = 0; j < half; ++j) {
            const int i0 = style == RopeStyle::kInterleaved ? 2 * j : j;
            const int i1 = style == RopeStyle::kInterleaved ? 2 * j + 1 : j + half;
            const float a = v[i0], b = v[i1], sj = sign * s[j];
            v[i0] = a * c[j] - b * sj;
            v[i1] = a * sj + b * c[j];
        }
    }
}

void rope_inverse(float* x, int n_heads, int head_dim, int64_t pos, float base, RopeStyle style) {
    // RoPE at -pos is not the exact inverse in float (the angles round differently); rotate
    // by the same angles the forward RoPE used, the other way.
    std::vector<float> c(static_cast<size_t>(head_dim / 2)), s(c.size());
    rope_angles(pos, head_dim, base, c.data(), s.data());
    rope_apply(x, n_heads, head_dim, c.data(), s.data(), style, true);
}

}  // namespace deltaserve::kernels
