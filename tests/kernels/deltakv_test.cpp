// DeltaKV's kernels against straightforward double-precision versions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <tuple>
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

// n random fp16 rows of `width` values, and pointers to them.
std::vector<std::vector<uint16_t>> fp16_rows(int n, int width, std::mt19937& rng) {
    std::vector<std::vector<uint16_t>> rows(static_cast<size_t>(n));
    for (auto& r : rows) {
        for (float x : randn(static_cast<size_t>(width), rng)) r.push_back(fp32_to_fp16(x));
    }
    return rows;
}

std::vector<const uint16_t*> row_pointers(const std::vector<std::vector<uint16_t>>& rows) {
    std::vector<const uint16_t*> ptrs;
    for (const auto& r : rows) ptrs.push_back(r.data());
    return ptrs;
}

TEST(DeltaKvKernels, EncodeResidualAndDecodeMatchTheFormulas) {
    std::mt19937 rng(5);
    const int d = 24, h = 36, m = 6, n = 5;
    auto w1 = randn(h * d, rng, 0.2f), w2 = randn(h * d, rng, 0.2f), w3 = randn(m * h, rng, 0.2f),
         wd = randn(d * m, rng, 0.2f);
    DeltaKvLayer w{{DType::kF32, h, d, w1.data()},
                   {DType::kF32, h, d, w2.data()},
                   {DType::kF32, m, h, w3.data()},
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
        const float lo = *std::min_element(z.begin(), z.end()),
                    hi = *std::max_element(z.begin(), z.end());
        const float step = (hi - lo) / 15.0f;
        for (int i = 0; i < m; ++i)
            EXPECT_LE(std::fabs(back[i] - z[i]), 0.5f * step * 1.01f + 2e-3f) << i;
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
        for (int j = 0; j < d; ++j)
            s += (double(x[j]) - c[i * d + j]) * (double(x[j]) - c[i * d + j]);
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
    // The default model's shape (64-row tiles), and ones with row, column, code and token
    // tails (m = 37: 32 codes unpacked at once, then pairs, then an odd one).
    for (auto [d, m, n] : {std::tuple{384, 96, 37}, std::tuple{40, 10, 7}, std::tuple{72, 37, 6}}) {
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

// A scorer's sketch decodes a few rows of a layer's K decoder (int4_decoder_rows): the rows
// chosen, in their order, must decode to what the whole decoder gives for them.
TEST(DeltaKvKernels, Int4DecoderRowsDecodeThoseRows) {
    std::mt19937 rng(14);
    // 48 rows: the default model's quarter of its 192 K rows (a 48-row tile); 56 and 5:
    // 16-row tiles and row tails.
    for (auto [d, m, n, n_rows] :
         {std::tuple{192, 192, 21, 48}, std::tuple{72, 37, 6, 56}, std::tuple{40, 10, 7, 5}}) {
        Int4Case c(d, m, n, rng);
        const Int4Decoder dec = make_int4_decoder(c.layer);
        std::uniform_int_distribution<int> pick(0, d - 1);
        std::vector<int32_t> rows(static_cast<size_t>(n_rows));
        for (auto& r : rows) r = pick(rng);  // any order, repeats allowed
        Int4Decoder sub;
        int4_decoder_rows(dec, rows.data(), n_rows, sub);
        ASSERT_EQ(sub.d, n_rows);
        std::vector<float> all(size_t(n) * d), part(size_t(n) * n_rows);
        deltakv_decode_int4(dec, c.ptrs.data(), n, all.data(), d);
        deltakv_decode_int4(sub, c.ptrs.data(), n, part.data(), n_rows);
        for (int i = 0; i < n; ++i) {
            for (int r = 0; r < n_rows; ++r) {
                const float want = all[size_t(i) * d + rows[r]];
                ASSERT_NEAR(part[size_t(i) * n_rows + r], want, 1e-6f * (1.0f + std::fabs(want)))
                    << "d " << d << " token " << i << " row " << r;
            }
        }
    }
}

// A decode step's keys: the decoded row, its references' mean and RoPE in one pass must be
// the bits of the three steps apart (the fused AVX-512 pass where the CPU has it).
TEST(DeltaKvKernels, Int4DecodeWithFinishIsDecodeThenMeanThenRope) {
    std::mt19937 rng(15);
    const int head_dim = 64, half = head_dim / 2, k = 4;
    // K rows only (3 KV heads, RoPE on all of them); K and V rows (RoPE on the first half);
    // the split-half pairing (the generic path everywhere).
    for (auto [d, n, style] :
         {std::tuple{192, 21, RopeStyle::kInterleaved}, std::tuple{384, 5, RopeStyle::kInterleaved},
          std::tuple{192, 7, RopeStyle::kSplitHalf}}) {
        const int m = 64, n_heads = 3;
        Int4Case c(d, m, n, rng);
        const Int4Decoder dec = make_int4_decoder(c.layer);
        std::vector<std::vector<float>> refs;
        for (int r = 0; r < 6; ++r) refs.push_back(randn(size_t(d), rng, 1.0f));
        std::vector<const float*> ref_ptrs(size_t(n) * k);
        std::uniform_int_distribution<int> pick(-1, 5);  // -1: no reference in that slot
        for (auto& p : ref_ptrs) {
            const int r = pick(rng);
            p = r < 0 ? nullptr : refs[r].data();
        }
        std::vector<std::vector<float>> angle_rows;
        std::vector<const float*> angles;
        for (int i = 0; i < n; ++i) {
            angle_rows.push_back(std::vector<float>(size_t(head_dim)));
            rope_angles(1000 + 37 * i, head_dim, 10000.0f, angle_rows.back().data(),
                        angle_rows.back().data() + half);
        }
        for (auto& a : angle_rows) angles.push_back(a.data());
        Int4KeyFinish f;
        f.refs = ref_ptrs.data();
        f.k = k;
        f.angles = angles.data();
        f.n_heads = n_heads;
        f.head_dim = head_dim;
        f.style = style;
        std::vector<float> got(size_t(n) * d), want(got.size());
        deltakv_decode_int4(dec, c.ptrs.data(), n, got.data(), d, nullptr, &f);
        deltakv_decode_int4(dec, c.ptrs.data(), n, want.data(), d);
        for (int i = 0; i < n; ++i) {
            std::vector<const float*> rows;
            for (int q = 0; q < k; ++q) {
                if (ref_ptrs[size_t(i) * k + q] != nullptr)
                    rows.push_back(ref_ptrs[size_t(i) * k + q]);
            }
            float* y = want.data() + size_t(i) * d;
            add_mean_rows(y, rows.data(), int(rows.size()), d);
            rope_apply(y, n_heads, head_dim, angles[i], angles[i] + half, style, false);
        }
        for (size_t t = 0; t < got.size(); ++t) {
            ASSERT_EQ(got[t], want[t]) << "d " << d << " token " << t / d << " value " << t % d;
        }
    }
}

TEST(DeltaKvKernels, AddMeanRowsAddsTheRowsAverage) {
    std::mt19937 rng(13);
    const int dims = 21;  // a vector part and a tail
    for (int n : {0, 1, 4}) {
        std::vector<std::vector<float>> rows;
        std::vector<const float*> ptrs;
        for (int q = 0; q < n; ++q) rows.push_back(randn(dims, rng, 1.0f));
        for (auto& r : rows) ptrs.push_back(r.data());
        auto x = randn(dims, rng, 1.0f);
        auto want = x;
        for (int t = 0; t < dims; ++t) {
            for (int q = 0; q < n; ++q) want[t] += rows[q][t] / n;
        }
        add_mean_rows(x.data(), ptrs.data(), n, dims);
        for (int t = 0; t < dims; ++t) EXPECT_NEAR(x[t], want[t], 1e-5) << "n " << n << " t " << t;
    }
}

TEST(DeltaKvKernels, Int4DotsAreTheSameIntegersOnEveryIsa) {
    if (!cpu_features().avx512_vnni) GTEST_SKIP() << "no AVX-512 VNNI on this CPU";
    std::mt19937 rng(12);
    for (auto [d, m, n] : {std::tuple{384, 96, 9}, std::tuple{56, 12, 5}}) {
        Int4Case c(d, m, n, rng);
        const Int4Decoder dec = make_int4_decoder(c.layer);
        std::vector<uint8_t> codes(size_t(n) * dec.m16, 0);
        std::uniform_int_distribution<int> u(0, 15);
        for (int i = 0; i < n; ++i) {
            for (int j = 0; j < m; ++j) codes[size_t(i) * dec.m16 + j] = uint8_t(u(rng));
        }
        std::vector<int32_t> a(size_t(n) * d), b(a.size()), want(a.size());
        int4_dots_avx2(dec.ref(), codes.data(), n, a.data());
        int4_dots_avx512(dec.ref(), codes.data(), n, b.data());
        for (int i = 0; i < n; ++i)
            int4_dots_rows(dec.ref(), codes.data() + size_t(i) * dec.m16, 0,
                           want.data() + size_t(i) * d);
        EXPECT_EQ(a, want);
        EXPECT_EQ(b, want);
    }
}

TEST(DeltaKvKernels, Int4CodesAreTheSameOnEveryIsa) {
    if (!cpu_features().avx512bw) GTEST_SKIP() << "no AVX-512 BW on this CPU";
    std::mt19937 rng(16);
    std::uniform_int_distribution<int> byte(0, 255);
    for (int m : {256, 192, 64, 37, 130, 7}) {  // whole 64-code steps, and tails of each kind
        std::vector<uint8_t> packed(size_t(m + 1) / 2);
        for (auto& b : packed) b = uint8_t(byte(rng));
        std::vector<uint8_t> a(size_t(m), 0xAA), b(size_t(m), 0x55),
            want(static_cast<size_t>(m), 0);
        int4_codes(packed.data(), m, a.data());
        int4_codes_avx512(packed.data(), m, b.data());
        for (int j = 0; j < m; ++j) want[j] = j % 2 == 0 ? packed[j / 2] & 15 : packed[j / 2] >> 4;
        EXPECT_EQ(a, want) << "m " << m;
        EXPECT_EQ(b, want) << "m " << m;
    }
}

TEST(DeltaKvKernels, Int4WeightedSumsAreTheSameBitsOnEveryIsa) {
    const bool avx512 = cpu_features().avx512f;
    std::mt19937 rng(14);
    std::uniform_int_distribution<int> u(0, 15);
    for (auto [heads, cols, n] :
         {std::tuple{9, 256, 64}, std::tuple{3, 48, 7}, std::tuple{17, 16, 5}}) {
        const int64_t ldw = n + 3, ldc = cols + 16, lda = cols + 32;
        auto w = randn(size_t(heads) * ldw, rng);
        std::vector<uint8_t> codes(size_t(n) * ldc);
        for (auto& c : codes) c = uint8_t(u(rng));
        auto a = randn(size_t(heads) * lda, rng), b = a;  // the sums add to what is there
        std::vector<double> want(a.begin(), a.end());
        int4_weighted_avx2(w.data(), ldw, heads, codes.data(), ldc, n, cols, a.data(), lda);
        if (avx512) {  // else the AVX2 version alone, against the sums below
            int4_weighted_avx512(w.data(), ldw, heads, codes.data(), ldc, n, cols, b.data(), lda);
            EXPECT_EQ(a, b) << heads << " heads";
        }
        for (int h = 0; h < heads; ++h) {
            for (int j = 0; j < lda; ++j) {
                if (j < cols) {
                    for (int i = 0; i < n; ++i)
                        want[h * lda + j] += double(w[h * ldw + i]) * codes[i * ldc + j];
                }
                EXPECT_NEAR(a[h * lda + j], want[h * lda + j], 1e-3) << h << " " << j;
            }
        }
    }
}

TEST(DeltaKvKernels, MaxHeadScoresAreTheBestQueryHeadsDotProduct) {
    std::mt19937 rng(13);
    const int n_heads = 6, n_kv = 2, dim = 20, n = 70;
    auto q = randn(n_heads * dim, rng);
    const auto rows = fp16_rows(n, n_kv * dim, rng);
    const auto ptrs = row_pointers(rows);
    std::vector<float> got(n);
    ThreadPool pool(2);
    max_head_scores(q.data(), n_heads, n_kv, dim, ptrs.data(), n, got.data(), pool);
    for (int t = 0; t < n; ++t) {
        double best = -1e30;
        for (int h = 0; h < n_heads; ++h) {
            double s = 0;
            for (int i = 0; i < dim; ++i)
                s += double(q[h * dim + i]) * fp16_to_fp32(rows[t][(h / 3) * dim + i]);
            best = std::max(best, s);
        }
        EXPECT_NEAR(got[t], best, 1e-4) << t;
    }
}

// The attention a few query rows give each token, summed over the rows: each row's softmax
// weight with its shift (here the row's log-sum-exp over these tokens, so that each row's
// weights sum to one), added to what out held.
TEST(DeltaKvKernels, AttentionMassIsTheRowsSoftmaxWeightsSummed) {
    std::mt19937 rng(14);
    const int n_heads = 6, n_kv = 2, dim = 16, n = 90, n_q = 3, ldq = n_heads * dim + 5;
    const float scale = 0.25f;
    auto q = randn(n_q * ldq, rng);
    const auto rows = fp16_rows(n, n_kv * dim, rng);
    const auto ptrs = row_pointers(rows);
    std::vector<double> logit(static_cast<size_t>(n_q) * n_heads * n);
    std::vector<float> shift(static_cast<size_t>(n_q) * n_heads);
    for (int i = 0; i < n_q; ++i) {
        for (int h = 0; h < n_heads; ++h) {
            double z = 0;
            for (int t = 0; t < n; ++t) {
                double s = 0;
                for (int d = 0; d < dim; ++d)
                    s +=
                        double(q[i * ldq + h * dim + d]) * fp16_to_fp32(rows[t][(h / 3) * dim + d]);
                logit[(static_cast<size_t>(i) * n_heads + h) * n + t] = scale * s;
                z += std::exp(scale * s);
            }
            shift[i * n_heads + h] = static_cast<float>(-std::log(z));
        }
    }
    std::vector<float> got(static_cast<size_t>(n_heads) * n, 1.0f);
    ThreadPool pool(2);
    attention_mass(q.data(), ldq, n_q, shift.data(), n_heads, n_kv, dim, scale, ptrs.data(), n,
                   got.data(), pool);
    for (int h = 0; h < n_heads; ++h) {
        double total = 0;
        for (int t = 0; t < n; ++t) {
            double want = 1.0;
            for (int i = 0; i < n_q; ++i)
                want += std::exp(logit[(static_cast<size_t>(i) * n_heads + h) * n + t] +
                                 shift[i * n_heads + h]);
            EXPECT_NEAR(got[h * n + t], want, 1e-5) << "head " << h << " token " << t;
            total += got[h * n + t] - 1.0;
        }
        EXPECT_NEAR(total, n_q, 1e-4) << "each row's weights sum to one";
    }
}

// Attention over latent tokens equals attention over their values made in full:
// V_i = Dec_v(z_i) + the mean of i's reference V rows, softmax over the given scores; and
// merged with attention over other keys it equals attention over both.
TEST(DeltaKvKernels, LatentAttentionEqualsAttentionOverReconstructedValues) {
    for (bool int4 : {true, false}) {
        SCOPED_TRACE(int4 ? "int4 latents" : "fp16 latents");
        std::mt19937 rng(21);
        const int n_heads = 6, n_kv = 2, dim = 16, kv_dim = n_kv * dim, m = 12, slots = 3;
        const int64_t n = 300, n_refs = 40;  // several pieces of tokens and of references
        const AttentionShape shape{n_heads, n_kv, dim, 0.25f};
        auto wd_v = randn(static_cast<size_t>(kv_dim) * m, rng, 0.3f);
        auto scores = randn(static_cast<size_t>(n_heads) * n, rng, 2.0f);
        std::vector<std::vector<uint8_t>> packed(n);
        std::vector<const uint8_t*> latents;
        std::vector<std::vector<float>> z(n, std::vector<float>(m));
        for (int64_t i = 0; i < n; ++i) {
            auto zi = randn(m, rng);
            if (int4) {
                packed[i].resize(int4_bytes(m));
                int4_pack(zi.data(), m, packed[i].data());
                int4_unpack(packed[i].data(), m, z[i].data());
            } else {
                packed[i].resize(2 * m);
                for (int j = 0; j < m; ++j) {
                    const uint16_t h = fp32_to_fp16(zi[j]);
                    std::memcpy(packed[i].data() + 2 * j, &h, 2);
                    z[i][j] = fp16_to_fp32(h);
                }
            }
            latents.push_back(packed[i].data());
        }
        std::vector<std::vector<uint16_t>> ref_rows(n_refs);
        std::vector<const uint16_t*> ref_v;
        for (auto& r : ref_rows) {
            for (float x : randn(kv_dim, rng)) r.push_back(fp32_to_fp16(x));
            ref_v.push_back(r.data());
        }
        std::vector<int32_t> refs(n * slots);
        std::uniform_int_distribution<int32_t> pick(-1, n_refs - 1);  // -1: fewer references
        for (auto& r : refs) r = pick(rng);
        LatentTokens t;
        t.n = n;
        t.scores = scores.data();
        t.latents = latents.data();
        t.int4 = int4;
        t.m = m;
        t.wd_v = wd_v.data();
        t.refs = refs.data();
        t.ref_slots = slots;
        t.ref_v = ref_v.data();
        t.n_refs = n_refs;
        std::vector<float> out(n_heads * dim), lse(n_heads);
        ThreadPool pool(2);
        latent_attention(shape, t, out.data(), lse.data(), pool);
        // The same with one thread: the same bits.
        std::vector<float> out1(out.size()), lse1(lse.size());
        ThreadPool one(1);
        latent_attention(shape, t, out1.data(), lse1.data(), one);
        EXPECT_EQ(out, out1);
        EXPECT_EQ(lse, lse1);
        for (int h = 0; h < n_heads; ++h) {
            const int g = h / (n_heads / n_kv);
            double mx = -1e30, sum = 0;
            for (int64_t i = 0; i < n; ++i) mx = std::max(mx, double(scores[h * n + i]));
            std::vector<double> o(dim, 0.0);
            for (int64_t i = 0; i < n; ++i) {
                const double p = std::exp(scores[h * n + i] - mx);
                sum += p;
                int nr = 0;
                for (int q = 0; q < slots; ++q) nr += refs[i * slots + q] >= 0;
                for (int d = 0; d < dim; ++d) {
                    double v = 0;  // V_i, made in full
                    for (int j = 0; j < m; ++j) v += double(wd_v[(g * dim + d) * m + j]) * z[i][j];
                    for (int q = 0; q < slots; ++q) {
                        const int32_t r = refs[i * slots + q];
                        if (r >= 0) v += fp16_to_fp32(ref_rows[r][g * dim + d]) / nr;
                    }
                    o[d] += p * v;
                }
            }
            EXPECT_NEAR(lse[h], mx + std::log(sum), 1e-4) << "head " << h;
            for (int d = 0; d < dim; ++d)
                EXPECT_NEAR(out[h * dim + d], o[d] / sum, 1e-4) << "head " << h << " " << d;
        }
    }
}

TEST(DeltaKvKernels, MergedAttentionIsAttentionOverBothSets) {
    // Two sets of keys with scores and values, one row: softmax over each, merged, equals
    // softmax over the union.
    std::mt19937 rng(22);
    const int dim = 8, na = 5, nb = 7;
    auto sa = randn(na, rng, 3.0f), sb = randn(nb, rng, 3.0f);
    auto va = randn(na * dim, rng), vb = randn(nb * dim, rng);
    auto attend = [&](const std::vector<float>& sc, const std::vector<float>& v, int n,
                      std::vector<float>& o, float& lse) {
        double mx = -1e30, sum = 0;
        for (int i = 0; i < n; ++i) mx = std::max(mx, double(sc[i]));
        std::vector<double> acc(dim, 0.0);
        for (int i = 0; i < n; ++i) {
            const double p = std::exp(sc[i] - mx);
            sum += p;
            for (int d = 0; d < dim; ++d) acc[d] += p * v[i * dim + d];
        }
        o.resize(dim);
        for (int d = 0; d < dim; ++d) o[d] = static_cast<float>(acc[d] / sum);
        lse = static_cast<float>(mx + std::log(sum));
    };
    std::vector<float> oa, ob, all;
    float la, lb, lall;
    attend(sa, va, na, oa, la);
    attend(sb, vb, nb, ob, lb);
    std::vector<float> s_all = sa, v_all = va;
    s_all.insert(s_all.end(), sb.begin(), sb.end());
    v_all.insert(v_all.end(), vb.begin(), vb.end());
    attend(s_all, v_all, na + nb, all, lall);
    merge_attention(oa.data(), &la, ob.data(), &lb, 1, dim);
    for (int d = 0; d < dim; ++d) EXPECT_NEAR(oa[d], all[d], 1e-5);
    EXPECT_NEAR(la, lall, 1e-5);
}

}  // namespace
}  // namespace deltaserve::kernels
