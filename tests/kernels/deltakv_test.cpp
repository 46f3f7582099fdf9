// DeltaKV's kernels against straightforward double-precision versions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <tuple>
#include <random>
#include <vector>

#include "cpu_features.h"
#include "deltakv_int4_kernels.h"
#include "deltaserve/common/fp16.h"
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

TEST(DeltaKvKernels, RopeApplyWithTheAnglesIsRope) {
    std::mt19937 rng(3);
    for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kSplitHalf}) {
        for (int dim : {64, 12}) {  // vector lanes, and a tail
            auto x = randn(3 * dim, rng);
            auto y = x;
            rope(x.data(), 3, dim, 777, 10000.0f, style);
            std::vector<float> c(dim / 2), s(dim / 2);
            rope_angles(777, dim, 10000.0f, c.data(), s.data());
            rope_apply(y.data(), 3, dim, c.data(), s.data(), style, false);
            for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-5) << i;
        }
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

// Random latents packed as int4 and a decoder with random weights.
struct Int4Case {
    std::vector<float> wd;
    DeltaKvLayer layer;
    std::vector<std::vector<uint8_t>> packed;
    std::vector<const uint8_t*> ptrs;
    Int4Case(int d, int m, int n, std::mt19937& rng) : wd(randn(size_t(d) * m, rng, 0.3f)) {
        layer.wd = {DType::kF32, d, m, wd.data()};
        layer.w3 = {DType::kF32, m, 1, nullptr};
        layer.w1 = {DType::kF32, 1, d, nullptr};
        for (int i = 0; i < n; ++i) {
            auto z = randn(m, rng, 2.0f);
            packed.emplace_back(int4_bytes(m));
            int4_pack(z.data(), m, packed.back().data());
        }
        for (auto& p : packed) ptrs.push_back(p.data());
    }
};

TEST(DeltaKvKernels, Int4DecoderMatchesTheFp32DecoderWithinInt8Rounding) {
    std::mt19937 rng(11);
    // The default model's shape (96-row tiles), and one with row, column and token tails.
    for (auto [d, m, n] : {std::tuple{384, 96, 37}, std::tuple{40, 10, 7}}) {
        Int4Case c(d, m, n, rng);
        const Int4Decoder dec = make_int4_decoder(c.layer);
        std::vector<float> out(size_t(n) * d);
        deltakv_decode_int4(dec, c.ptrs.data(), n, out.data(), d);
        for (int i = 0; i < n; ++i) {
            std::vector<float> z(m);
            int4_unpack(c.packed[i].data(), m, z.data());
            uint16_t s16;
            std::memcpy(&s16, c.packed[i].data(), 2);
            const double s = fp16_to_fp32(s16);
            for (int r = 0; r < d; ++r) {
                double want = 0;
                for (int j = 0; j < m; ++j) want += double(c.wd[size_t(r) * m + j]) * z[j];
                // Each int8 weight is off by at most half a step; codes are at most 15.
                const double bound = s * dec.scale[r] / 2 * 15 * m + 1e-4 * (1 + std::fabs(want));
                ASSERT_NEAR(out[size_t(i) * d + r], want, bound) << "token " << i << " row " << r;
            }
        }
    }
}

TEST(DeltaKvKernels, Int4DotsAreTheSameIntegersOnEveryIsa) {
    if (!cpu_features().avx512_vnni) GTEST_SKIP() << "no AVX-512 VNNI on this CPU";
    std::mt19937 rng(12);
    for (auto [d, m, n] : {std::tuple{384, 96, 9}, std::tuple{56, 12, 5}}) {
        Int4Case c(d, m, n, rng);
        const Int4Decoder dec = make_int4_decoder(c.layer);
        std::vector<uint8_t> codes(size_t(n) * dec.m4, 0);
        std::uniform_int_distribution<int> u(0, 15);
        for (int i = 0; i < n; ++i) {
            for (int j = 0; j < m; ++j) codes[size_t(i) * dec.m4 + j] = uint8_t(u(rng));
        }
        std::vector<int32_t> a(size_t(n) * d), b(a.size()), want(a.size());
        int4_dots_avx2(dec, codes.data(), n, a.data());
        int4_dots_avx512(dec, codes.data(), n, b.data());
        for (int i = 0; i < n; ++i) int4_dots_rows(dec, codes.data() + size_t(i) * dec.m4, 0, want.data() + size_t(i) * d);
        EXPECT_EQ(a, want);
        EXPECT_EQ(b, want);
    }
}

TEST(DeltaKvKernels, MaxHeadScoresAreTheBestQueryHeadsDotProduct) {
    std::mt19937 rng(13);
    const int n_heads = 6, n_kv = 2, dim = 20, n = 70;
    auto q = randn(n_heads * dim, rng);
    std::vector<std::vector<uint16_t>> rows(n);
    std::vector<const uint16_t*> ptrs;
    for (auto& r : rows) {
        for (float x : randn(n_kv * dim, rng)) r.push_back(fp32_to_fp16(x));
        ptrs.push_back(r.data());
    }
    std::vector<float> got(n);
    ThreadPool pool(2);
    max_head_scores(q.data(), n_heads, n_kv, dim, ptrs.data(), n, got.data(), pool);
    for (int t = 0; t < n; ++t) {
        double best = -1e30;
        for (int h = 0; h < n_heads; ++h) {
            double s = 0;
            for (int i = 0; i < dim; ++i) s += double(q[h * dim + i]) * fp16_to_fp32(rows[t][(h / 3) * dim + i]);
            best = std::max(best, s);
        }
        EXPECT_NEAR(got[t], best, 1e-4) << t;
    }
}

}  // namespace
}  // namespace deltaserve::kernels
