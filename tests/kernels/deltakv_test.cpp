// DeltaKV's kernels against straightforward double-precision versions.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "deltaserve/kernels/deltakv.h"

namespace deltaserve::kernels {
namespace {

std::vector<float> randn(size_t n, std::mt19937& rng, float scale = 1.0f) {
    std::normal_distribution<float> nd(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = nd(rng);
    return v;
}

TEST(DeltaKvKernels, EncodeResidualAndDecodeMatchTheFormulas) {
    std::mt19937 rng(5);
    const int d = 24, h = 36, m = 6, n = 5;
    auto w1 = randn(h * d, rng, 0.2f), w2 = randn(h * d, rng, 0.2f), w3 = randn(m * h, rng, 0.2f),
         wd = randn(d * m, rng, 0.2f);
    DeltaKvLayer w{{DType::kF32, h, d, w1.data()}, {DType::kF32, h, d, w2.data()}, {DType::kF32, m, h, w3.data()},
                   {DType::kF32, d, m, wd.data()}};
    auto x = randn(n * d, rng), r = randn(n * d, rng);
    std::vector<float> z(n * m), scratch(2 * n * h);
    ThreadPool pool(2);
    deltakv_encode_residual(w, x.data(), r.data(), n, z.data(), scratch.data(), pool);
    auto encode = [&](const float* u, std::vector<double>& e) {
        e.assign(m, 0.0);
        for (int j = 0; j < h; ++j) {
            double a = 0, b = 0;
            for (int i = 0; i < d; ++i) {
                a += double(w1[j * d + i]) * u[i];
                b += double(w2[j * d + i]) * u[i];
            }
            const double g = a / (1 + std::exp(-a)) * b;
            for (int o = 0; o < m; ++o) e[o] += double(w3[o * h + j]) * g;
        }
    };
    for (int t = 0; t < n; ++t) {
        std::vector<double> ex, er;
        encode(x.data() + t * d, ex);
        encode(r.data() + t * d, er);
        for (int o = 0; o < m; ++o) EXPECT_NEAR(z[t * m + o], ex[o] - er[o], 1e-3) << "token " << t;
        std::vector<float> out(d);
        deltakv_decode(w, z.data() + t * m, r.data() + t * d, out.data());
        for (int i = 0; i < d; ++i) {
            double want = r[t * d + i];
            for (int o = 0; o < m; ++o) want += double(wd[i * m + o]) * z[t * m + o];
            EXPECT_NEAR(out[i], want, 1e-4);
        }
    }
}

TEST(DeltaKvKernels, Int4RoundTripWithinHalfAStep) {
    std::mt19937 rng(9);
    for (int m : {96, 7}) {
        auto z = randn(m, rng, 3.0f);
        std::vector<uint8_t> packed(int4_bytes(m));
        int4_pack(z.data(), m, packed.data());
        std::vector<float> back(m);
        int4_unpack(packed.data(), m, back.data());
        const float lo = *std::min_element(z.begin(), z.end()), hi = *std::max_element(z.begin(), z.end());
        const float step = (hi - lo) / 15.0f;
        for (int i = 0; i < m; ++i) EXPECT_LE(std::fabs(back[i] - z[i]), 0.5f * step * 1.01f + 2e-3f) << i;
    }
}

TEST(DeltaKvKernels, RopeInverseUndoesRope) {
    std::mt19937 rng(2);
    for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kSplitHalf}) {
        auto x = randn(3 * 64, rng);
        auto y = x;
        rope(y.data(), 3, 64, 4321, 10000.0f, style);
        rope_inverse(y.data(), 3, 64, 4321, 10000.0f, style);
        for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-4);
    }
}

TEST(DeltaKvKernels, NearestByL2) {
    std::mt19937 rng(4);
    const int d = 16, n = 40;
    auto c = randn(n * d, rng), x = randn(d, rng);
    int32_t got[4];
    ASSERT_EQ(l2_nearest(x.data(), c.data(), n, d, 4, got), 4);
    std::vector<std::pair<double, int>> all;
    for (int i = 0; i < n; ++i) {
        double s = 0;
        for (int j = 0; j < d; ++j) s += (double(x[j]) - c[i * d + j]) * (double(x[j]) - c[i * d + j]);
        all.emplace_back(s, i);
    }
    std::sort(all.begin(), all.end());
    for (int i = 0; i < 4; ++i) EXPECT_EQ(got[i], all[i].second);
    EXPECT_EQ(l2_nearest(x.data(), c.data(), 2, d, 4, got), 2) << "k is clamped to the candidates";
}

}  // namespace
}  // namespace deltaserve::kernels
