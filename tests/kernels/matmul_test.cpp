// Quantized and float matmul kernels against a dequantize-then-dot reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "blocks.h"
#include "cpu_features.h"
#include "deltaserve/kernels/matmul.h"
#include "deltaserve/kernels/quant.h"
#include "deltaserve/kernels/repack.h"
#include "matmul_table.h"
#include "random_blocks.h"

namespace deltaserve::kernels {
namespace {

struct Case {
    DType type;
    int64_t rows, cols, tokens;
};

class MatmulTest : public ::testing::TestWithParam<Case> {};

TEST_P(MatmulTest, MatchesDequantizedReference) {
    const Case c = GetParam();
    std::mt19937 rng(42);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> wf(c.rows * c.cols), x(c.tokens * c.cols);
    for (auto& v : wf) v = nd(rng);
    for (auto& v : x) v = nd(rng);
    const size_t rb = row_bytes(c.type, c.cols);
    std::vector<uint8_t> wq(rb * c.rows);
    for (int64_t r = 0; r < c.rows; ++r)
        quantize_row(c.type, wf.data() + r * c.cols, wq.data() + r * rb, c.cols);
    WeightMatrix w{c.type, c.rows, c.cols, wq.data()};

    ThreadPool pool(2);
    std::vector<float> y(c.tokens * c.rows, 0.0f);
    matmul(w, x.data(), c.cols, c.tokens, y.data(), c.rows, pool);

    // Reference: dequantized weights times the (quantized, for int8 kernels) activations.
    const bool int8 = c.type == DType::kQ4_0 || c.type == DType::kQ4_1 || c.type == DType::kQ8_0;
    std::vector<float> xr(x);
    if (int8) {
        std::vector<uint8_t> xq(row_bytes(DType::kQ8_0, c.cols));
        for (int64_t t = 0; t < c.tokens; ++t) {
            quantize_row(DType::kQ8_0, x.data() + t * c.cols, xq.data(), c.cols);
            dequantize_row(DType::kQ8_0, xq.data(), xr.data() + t * c.cols, c.cols);
        }
    }
    std::vector<float> wd(c.cols);
    double max_err = 0, max_ref = 0;
    for (int64_t r = 0; r < c.rows; ++r) {
        dequantize_row(c.type, w.row(r), wd.data(), c.cols);
        for (int64_t t = 0; t < c.tokens; ++t) {
            double ref = 0;
            for (int64_t k = 0; k < c.cols; ++k) ref += double(wd[k]) * xr[t * c.cols + k];
            max_err = std::max(max_err, std::fabs(ref - y[t * c.rows + r]));
            max_ref = std::max(max_ref, std::fabs(ref));
        }
    }
    // int8 activations differ from the reference only by the fp16 rounding of their scale.
    const double tol = (int8 ? 2e-3 : 1e-4) * max_ref + 1e-4;
    EXPECT_LT(max_err, tol) << dtype_traits(c.type).name << " isa=" << cpu_kernel_isa();
}

INSTANTIATE_TEST_SUITE_P(
    Types, MatmulTest,
    ::testing::Values(Case{DType::kQ4_0, 37, 256, 1}, Case{DType::kQ4_0, 64, 576, 7},
                      Case{DType::kQ4_1, 37, 256, 1}, Case{DType::kQ4_1, 67, 576, 9},
                      Case{DType::kQ8_0, 33, 128, 1}, Case{DType::kQ8_0, 64, 576, 6},
                      Case{DType::kF32, 13, 172, 1}, Case{DType::kF32, 21, 64, 5},
                      Case{DType::kF16, 19, 96, 3}, Case{DType::kBF16, 19, 96, 3}));

}  // namespace
}  // namespace deltaserve::kernels

namespace deltaserve::kernels {
namespace {

TEST(MatmulSharedInput, EqualsSeparateMatmulsBitForBit) {
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int64_t cols = 576, tokens = 5;
    const int64_t rows[3] = {576, 192, 100};
    std::vector<std::vector<uint8_t>> data(3);
    std::vector<WeightMatrix> w(3);
    std::vector<float> row(cols);
    for (int i = 0; i < 3; ++i) {
        const size_t rb = row_bytes(DType::kQ4_1, cols);
        data[i].resize(rb * rows[i]);
        for (int64_t r = 0; r < rows[i]; ++r) {
            for (auto& v : row) v = nd(rng);
            quantize_row(DType::kQ4_1, row.data(), data[i].data() + r * rb, cols);
        }
        w[i] = {DType::kQ4_1, rows[i], cols, data[i].data()};
    }
    std::vector<float> x(tokens * cols);
    for (auto& v : x) v = nd(rng);
    ThreadPool pool(2);
    std::vector<std::vector<float>> sep(3), fused(3);
    std::vector<MatmulOutput> outs;
    for (int i = 0; i < 3; ++i) {
        sep[i].resize(tokens * rows[i]);
        fused[i].assign(tokens * rows[i], 0.0f);
        matmul(w[i], x.data(), cols, tokens, sep[i].data(), rows[i], pool);
        outs.push_back({&w[i], fused[i].data(), rows[i]});
    }
    matmul_shared_input(outs, x.data(), cols, tokens, pool);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(sep[i], fused[i]) << "output " << i;
}

}  // namespace
}  // namespace deltaserve::kernels

namespace deltaserve::kernels {
namespace {

// A token's outputs do not depend on the tokens beside it or on how rows fall into tiles
// (the decode worker batches sessions: a greedy answer must not change with the load).
TEST(MatmulBatchInvariance, EachTokenAsWhenAlone) {
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int64_t tokens = 9;
    const std::pair<int64_t, int64_t> shapes[] = {{67, 576}, {1536, 576}, {576, 1536}};
    for (const auto& [rows, cols] : shapes) {
        for (DType type : {DType::kQ4_0, DType::kQ4_1, DType::kQ8_0, DType::kF32, DType::kF16}) {
            std::vector<float> wf(rows * cols), x(tokens * cols);
            for (auto& v : wf) v = nd(rng);
            for (auto& v : x) v = nd(rng);
            const size_t rb = row_bytes(type, cols);
            std::vector<uint8_t> wq(rb * rows);
            for (int64_t r = 0; r < rows; ++r)
                quantize_row(type, wf.data() + r * cols, wq.data() + r * rb, cols);
            const WeightMatrix w{type, rows, cols, wq.data()};
            for (int threads : {1, 2}) {
                ThreadPool pool(threads);
                std::vector<float> all(tokens * rows);
                matmul(w, x.data(), cols, tokens, all.data(), rows, pool);
                for (int64_t t = 0; t < tokens; ++t) {
                    std::vector<float> one(rows);
                    matmul(w, x.data() + t * cols, cols, 1, one.data(), rows, pool);
                    EXPECT_EQ(one, std::vector<float>(all.begin() + t * rows,
                                                      all.begin() + (t + 1) * rows))
                        << dtype_traits(type).name << " " << rows << "x" << cols << " token " << t
                        << ", " << threads << " threads";
                }
            }
        }
    }
}

}  // namespace
}  // namespace deltaserve::kernels

namespace deltaserve::kernels {
namespace {

// Weights repacked at load (repack.h) give the bits of the row-major kernels for any number
// of tokens and either thread count, and every row reads back as it was.
TEST(MatmulRepacked, SameBitsAsRowMajor) {
    std::mt19937 rng(9);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const std::pair<int64_t, int64_t> shapes[] = {{64, 576}, {192, 96}, {8, 1536}};
    for (const auto& [rows, cols] : shapes) {
        for (DType type : {DType::kQ4_0, DType::kQ4_1, DType::kQ8_0}) {
            std::vector<float> wf(rows * cols);
            for (auto& v : wf) v = nd(rng);
            const size_t rb = row_bytes(type, cols);
            std::vector<uint8_t> wq(rb * rows), packed(rb * rows);
            for (int64_t r = 0; r < rows; ++r)
                quantize_row(type, wf.data() + r * cols, wq.data() + r * rb, cols);
            const WeightMatrix w{type, rows, cols, wq.data()};
            ASSERT_TRUE(repackable(w));
            const WeightMatrix p = repack_rows(w, packed.data());
            EXPECT_EQ(p.interleave, kRowInterleave);
            EXPECT_NE(packed, wq);
            std::vector<float> a(cols), b(cols);
            for (int64_t r = 0; r < rows; ++r) {
                dequantize_weight_row(w, r, a.data());
                dequantize_weight_row(p, r, b.data());
                ASSERT_EQ(a, b) << dtype_traits(type).name << " row " << r;
            }
            for (int64_t tokens : {1, 2, 3, 8, 17}) {
                std::vector<float> x(tokens * cols);
                for (auto& v : x) v = nd(rng);
                for (int threads : {1, 2}) {
                    ThreadPool pool(threads);
                    std::vector<float> ya(tokens * rows), yb(tokens * rows, -1.0f);
                    matmul(w, x.data(), cols, tokens, ya.data(), rows, pool);
                    matmul(p, x.data(), cols, tokens, yb.data(), rows, pool);
                    EXPECT_EQ(ya, yb)
                        << dtype_traits(type).name << " " << rows << "x" << cols << ", " << tokens
                        << " tokens, " << threads << " threads, isa " << cpu_kernel_isa();
                }
            }
        }
    }
}

TEST(MatmulRepacked, TakesOnlyWholeGroupsOfQuantizedRows) {
    std::vector<uint8_t> buf(row_bytes(DType::kQ4_1, 64) * 16);
    EXPECT_TRUE(repackable({DType::kQ4_1, 16, 64, buf.data()}));
    EXPECT_FALSE(repackable({DType::kQ4_1, 12, 64, buf.data()}));   // not whole groups of 8
    EXPECT_FALSE(repackable({DType::kF16, 16, 64, buf.data()}));    // float kernels read rows
    EXPECT_FALSE(repackable({DType::kQ3_K, 16, 256, buf.data()}));  // no interleaved kernel
    std::vector<uint8_t> out(buf.size());
    const WeightMatrix once = repack_rows({DType::kQ4_1, 16, 64, buf.data()}, out.data());
    EXPECT_FALSE(repackable(once));  // already interleaved
}

}  // namespace
}  // namespace deltaserve::kernels

namespace deltaserve::kernels {
namespace {

// In either summation order (DotOrder), the AVX2 and AVX-512 kernels, row-major and
// interleaved, give the same bits for every tile shape; the two orders differ. Only this
// CPU's table runs in the other tests.
TEST(MatmulIsa, Avx2AndAvx512GiveTheSameBits) {
    if (!cpu_features().avx512_vnni) GTEST_SKIP() << "no AVX-512 VNNI on this CPU";
    std::mt19937 rng(13);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int64_t rows = 40, cols = 576;
    for (DType type : {DType::kQ4_0, DType::kQ4_1, DType::kQ8_0}) {
        std::vector<float> wf(rows * cols);
        for (auto& v : wf) v = nd(rng);
        const size_t rb = row_bytes(type, cols);
        std::vector<uint8_t> wq(rb * rows), packed(rb * rows);
        for (int64_t r = 0; r < rows; ++r)
            quantize_row(type, wf.data() + r * cols, wq.data() + r * rb, cols);
        const WeightMatrix w{type, rows, cols, wq.data()};
        const WeightMatrix p = repack_rows(w, packed.data());
        for (int64_t tokens : {1, 2, 3, 5, 8, 13}) {
            std::vector<float> x(tokens * cols);
            for (auto& v : x) v = nd(rng);
            const int64_t nb = cols / kQK;
            std::vector<BlockQ8A> q(tokens * nb);
            for (int64_t t = 0; t < tokens; ++t)
                quantize_activations(x.data() + t * cols, q.data() + t * nb, cols);
            const Activations a{x.data(), cols, q.data(), tokens};
            const auto run = [&](const MatmulTable& t, bool interleaved, DotOrder order) {
                const QuantKernels& k = t.quant[static_cast<int>(order)];
                RowsFn f = type == DType::kQ4_0   ? (interleaved ? k.q4_0x8 : k.q4_0)
                           : type == DType::kQ4_1 ? (interleaved ? k.q4_1x8 : k.q4_1)
                                                  : (interleaved ? k.q8_0x8 : k.q8_0);
                std::vector<float> y(tokens * rows, -1.0f);
                f(interleaved ? p : w, a, y.data(), rows, 0, rows);
                return y;
            };
            std::vector<float> by_order[2];
            for (DotOrder order : {DotOrder::kBlock, DotOrder::kGgml}) {
                const std::vector<float> want = run(avx2_matmul_table(), false, order);
                const std::string what = std::string(dtype_traits(type).name) + ", " +
                                         std::to_string(tokens) + " tokens, order " +
                                         std::to_string(static_cast<int>(order));
                EXPECT_EQ(run(avx2_matmul_table(), true, order), want)
                    << "AVX2 interleaved, " << what;
                EXPECT_EQ(run(avx512_matmul_table(), false, order), want)
                    << "AVX-512 row-major, " << what;
                EXPECT_EQ(run(avx512_matmul_table(), true, order), want)
                    << "AVX-512 interleaved, " << what;
                by_order[static_cast<int>(order)] = want;
            }
            EXPECT_NE(by_order[0], by_order[1]) << dtype_traits(type).name;
        }
    }
}

}  // namespace
}  // namespace deltaserve::kernels

namespace deltaserve::kernels {
namespace {

// The types with no quantizer here: random blocks (test_blocks::random_rows).
const DType kNewTypes[] = {DType::kQ4_K, DType::kQ6_K, DType::kQ5_K,   DType::kQ3_K,  DType::kQ2_K,
                           DType::kQ5_0, DType::kQ5_1, DType::kIQ4_NL, DType::kIQ4_XS};

bool super_blocks(DType t) { return dtype_traits(t).block_elems == kQKK; }

// x's values as the kernels see them: quantized as their activation blocks, back in fp32.
std::vector<float> activations_as_quantized(DType t, const std::vector<float>& x, int64_t cols) {
    std::vector<float> out(x.size());
    const int64_t tokens = static_cast<int64_t>(x.size()) / cols;
    for (int64_t r = 0; r < tokens; ++r) {
        const float* src = x.data() + r * cols;
        float* dst = out.data() + r * cols;
        if (super_blocks(t)) {
            std::vector<BlockQ8K> q(cols / kQKK);
            quantize_activations_q8k(src, q.data(), cols);
            for (int64_t k = 0; k < cols; ++k) dst[k] = q[k / kQKK].d * q[k / kQKK].qs[k % kQKK];
        } else {
            std::vector<BlockQ8A> q(cols / kQK);
            quantize_activations(src, q.data(), cols);
            for (int64_t k = 0; k < cols; ++k) dst[k] = q[k / kQK].d * q[k / kQK].qs[k % kQK];
        }
    }
    return out;
}

// sum((y - ref)^2) / sum(ref^2) over all outputs, ref in float64 from the dequantized weights.
double nmse(const WeightMatrix& w, const std::vector<float>& x, const std::vector<float>& y) {
    const int64_t tokens = static_cast<int64_t>(x.size()) / w.cols;
    std::vector<float> row(w.cols);
    double err = 0, sum = 0;
    for (int64_t r = 0; r < w.rows; ++r) {
        dequantize_row(w.type, w.row(r), row.data(), w.cols);
        for (int64_t t = 0; t < tokens; ++t) {
            double ref = 0;
            for (int64_t k = 0; k < w.cols; ++k) ref += double(row[k]) * x[t * w.cols + k];
            const double e = y[t * w.rows + r] - ref;
            err += e * e;
            sum += ref * ref;
        }
    }
    return err / sum;
}

// Every new type against float64: with the activations as quantized, only the fp32 scale
// products and the block accumulation round (the block sums are exact integers), NMSE
// ~1e-14; Q5_0 and Q5_1 take their offset term through the activations' fp16-rounded sum s
// (BlockQ8A, as Q4_0 / Q4_1 and llama.cpp do), ~5e-7 for Q5_0's -16 d. Against the fp32
// activations their 8-bit rounding adds the bound the CUDA parity tests use (1e-4).
TEST(MatmulQuantTypes, MatchFloat64) {
    std::mt19937 rng(21);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (DType type : kNewTypes) {
        for (const auto& [rows, cols, tokens] :
             {std::tuple<int64_t, int64_t, int64_t>{37, 1024, 1}, {64, 1536, 7}}) {
            const std::vector<uint8_t> wq =
                test_blocks::random_rows(type, rows, cols, static_cast<uint32_t>(rows + cols));
            const WeightMatrix w{type, rows, cols, wq.data()};
            std::vector<float> x(tokens * cols);
            for (auto& v : x) v = nd(rng);
            ThreadPool pool(2);
            std::vector<float> y(tokens * rows, -1.0f);
            matmul(w, x.data(), cols, tokens, y.data(), rows, pool);
            const double exact = nmse(w, activations_as_quantized(type, x, cols), y);
            const double total = nmse(w, x, y);
            const bool offset_via_s = type == DType::kQ5_0 || type == DType::kQ5_1;
            EXPECT_LT(exact, offset_via_s ? 2e-6 : 1e-12)
                << dtype_traits(type).name << " " << rows << "x" << cols;
            EXPECT_LT(total, 1e-4) << dtype_traits(type).name << " " << rows << "x" << cols;
            std::printf("%-7s %4ldx%-5ld %2ld tokens: NMSE %.2e (as quantized), %.2e (fp32 x)\n",
                        std::string(dtype_traits(type).name).c_str(), long(rows), long(cols),
                        long(tokens), exact, total);
        }
    }
}

// A token's outputs are the same bits whatever the tokens beside it, the thread count, the
// instruction set, and in either DotOrder (these types run the same kernels in both).
TEST(MatmulQuantTypes, SameBitsForAnyBatchThreadsIsaAndOrder) {
    std::mt19937 rng(23);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int64_t rows = 45, cols = 1024, tokens = 9;
    for (DType type : kNewTypes) {
        const std::vector<uint8_t> wq = test_blocks::random_rows(type, rows, cols, 99);
        const WeightMatrix w{type, rows, cols, wq.data()};
        std::vector<float> x(tokens * cols);
        for (auto& v : x) v = nd(rng);
        const std::string name(dtype_traits(type).name);
        std::vector<float> all(tokens * rows);
        {
            ThreadPool pool(2);
            matmul(w, x.data(), cols, tokens, all.data(), rows, pool);
            std::vector<float> ggml(tokens * rows);
            matmul(w, x.data(), cols, tokens, ggml.data(), rows, pool, DotOrder::kGgml);
            EXPECT_EQ(ggml, all) << name << ": kGgml runs the same kernels";
        }
        ThreadPool one(1);
        for (int64_t t = 0; t < tokens; ++t) {
            std::vector<float> alone(rows);
            matmul(w, x.data() + t * cols, cols, 1, alone.data(), rows, one);
            EXPECT_EQ(alone,
                      std::vector<float>(all.begin() + t * rows, all.begin() + (t + 1) * rows))
                << name << " token " << t;
        }
        if (!cpu_features().avx512_vnni) continue;
        const int64_t nb = cols / kQK, nbk = cols / kQKK;
        std::vector<BlockQ8A> q(tokens * nb);
        std::vector<BlockQ8K> qk(tokens * nbk);
        for (int64_t t = 0; t < tokens; ++t) {
            quantize_activations(x.data() + t * cols, q.data() + t * nb, cols);
            quantize_activations_q8k(x.data() + t * cols, qk.data() + t * nbk, cols);
        }
        Activations a{x.data(), cols, q.data(), tokens, qk.data()};
        const auto run = [&](const MatmulTable& table) {
            const QuantKernels& k = table.quant[0];
            const RowsFn f = type == DType::kQ4_K     ? k.q4_k
                             : type == DType::kQ6_K   ? k.q6_k
                             : type == DType::kQ5_K   ? k.q5_k
                             : type == DType::kQ3_K   ? k.q3_k
                             : type == DType::kQ2_K   ? k.q2_k
                             : type == DType::kQ5_0   ? k.q5_0
                             : type == DType::kQ5_1   ? k.q5_1
                             : type == DType::kIQ4_NL ? k.iq4_nl
                                                      : k.iq4_xs;
            std::vector<float> y(tokens * rows, -1.0f);
            f(w, a, y.data(), rows, 0, rows);
            return y;
        };
        const std::vector<float> avx2 = run(avx2_matmul_table());
        EXPECT_EQ(avx2, all) << name;
        EXPECT_EQ(run(avx512_matmul_table()), avx2) << name << ": AVX-512 vs AVX2";
    }
}

// Hostile values: a NaN or inf scale in a weight block, or a NaN activation, gives a NaN or
// inf output where it reaches (never a finite value that hides it), for every new type.
TEST(MatmulQuantTypes, NonFiniteScalesAndActivationsReachTheOutputs) {
    const int64_t rows = 8, cols = 512;
    for (DType type : kNewTypes) {
        const std::string name(dtype_traits(type).name);
        std::vector<uint8_t> wq = test_blocks::random_rows(type, rows, cols, 3);
        const uint16_t nan = 0x7E00, inf = 0x7C00;
        const int d_at = test_blocks::half_offsets(type)[0];
        std::memcpy(&wq[d_at], &nan, 2);                          // row 0, block 0
        std::memcpy(&wq[row_bytes(type, cols) + d_at], &inf, 2);  // row 1, block 0
        const WeightMatrix w{type, rows, cols, wq.data()};
        std::vector<float> x(2 * cols, 0.5f);
        x[cols + 7] = std::numeric_limits<float>::quiet_NaN();  // token 1
        ThreadPool pool(1);
        std::vector<float> y(2 * rows);
        matmul(w, x.data(), cols, 2, y.data(), rows, pool);
        EXPECT_TRUE(std::isnan(y[0])) << name;
        EXPECT_FALSE(std::isfinite(y[1])) << name;
        for (int64_t r = 2; r < rows; ++r) EXPECT_TRUE(std::isfinite(y[r])) << name << " " << r;
        for (int64_t r = 0; r < rows; ++r) EXPECT_TRUE(std::isnan(y[rows + r])) << name << " " << r;
    }
}

// Q4_K and Q6_K repacked (BlockQ4_Kx8, BlockQ6_Kx8) give the row-major kernels' bits for any
// token count, thread count and ISA, read back as they were, and unpack to the same bytes.
TEST(MatmulQuantTypes, RepackedSameBitsAsRowMajor) {
    std::mt19937 rng(29);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const std::pair<int64_t, int64_t> shapes[] = {{64, 1024}, {192, 256}, {8, 2048}};
    for (const auto& [rows, cols] : shapes) {
        for (DType type : {DType::kQ4_K, DType::kQ6_K}) {
            const std::string name(dtype_traits(type).name);
            std::vector<uint8_t> wq = test_blocks::random_rows(type, rows, cols, 7);
            std::vector<uint8_t> packed(wq.size()), back(wq.size());
            const WeightMatrix w{type, rows, cols, wq.data()};
            ASSERT_TRUE(repackable(w)) << name;
            const WeightMatrix p = repack_rows(w, packed.data());
            EXPECT_NE(packed, wq);
            EXPECT_EQ(unpack_rows(p, back.data()).interleave, 1);
            EXPECT_EQ(back, wq) << name;
            std::vector<float> ra(cols), rb(cols);
            for (int64_t r = 0; r < rows; ++r) {
                dequantize_weight_row(w, r, ra.data());
                dequantize_weight_row(p, r, rb.data());
                ASSERT_EQ(ra, rb) << name << " row " << r;
            }
            for (int64_t tokens : {1, 2, 3, 8, 17}) {
                std::vector<float> x(tokens * cols);
                for (auto& v : x) v = nd(rng);
                for (int threads : {1, 2}) {
                    ThreadPool pool(threads);
                    std::vector<float> ya(tokens * rows), yb(tokens * rows, -1.0f);
                    matmul(w, x.data(), cols, tokens, ya.data(), rows, pool);
                    matmul(p, x.data(), cols, tokens, yb.data(), rows, pool);
                    EXPECT_EQ(ya, yb) << name << " " << rows << "x" << cols << ", " << tokens
                                      << " tokens, " << threads << " threads";
                }
                if (!cpu_features().avx512_vnni) continue;
                const int64_t nbk = cols / kQKK;
                std::vector<BlockQ8K> qk(tokens * nbk);
                for (int64_t t = 0; t < tokens; ++t)
                    quantize_activations_q8k(x.data() + t * cols, qk.data() + t * nbk, cols);
                const Activations a{x.data(), cols, nullptr, tokens, qk.data()};
                // The shape by value: clang 14 does not capture structured bindings.
                const int64_t n_rows = rows;
                const auto run = [&, n_rows](const MatmulTable& table) {
                    const QuantKernels& k = table.quant[0];
                    std::vector<float> y(tokens * n_rows, -1.0f);
                    (type == DType::kQ4_K ? k.q4_kx8 : k.q6_kx8)(p, a, y.data(), n_rows, 0, n_rows);
                    return y;
                };
                const std::vector<float> avx2 = run(avx2_matmul_table());
                std::vector<float> want(tokens * rows);
                ThreadPool one(1);
                matmul(w, x.data(), cols, tokens, want.data(), rows, one);
                EXPECT_EQ(avx2, want) << name << " AVX2 interleaved, " << tokens << " tokens";
                EXPECT_EQ(run(avx512_matmul_table()), want)
                    << name << " AVX-512 interleaved, " << tokens << " tokens";
            }
        }
    }
}

}  // namespace
}  // namespace deltaserve::kernels
