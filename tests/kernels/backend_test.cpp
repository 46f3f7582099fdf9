// The forward pass's ops behind kernels::Backend on the CPU backend: each gives the same bits
// as the kernel the forward pass calls today (its promise: no change of results or speed),
// top_k the order of a full sort; its Buffers are aligned host memory that moves, not
// copies; an Exec without threads is refused; a backend without an op says so.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "deltaserve/common/thread_pool.h"
#include "deltaserve/kernels/backend.h"
#include "deltaserve/kernels/quant.h"
#include "deltaserve/kernels/repack.h"
#include "random_data.h"

namespace deltaserve::kernels {
namespace {

using testing::random_floats;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

class CpuBackendTest : public ::testing::Test {
  protected:
    Backend& cpu() { return *find_backend("cpu"); }
    ThreadPool pool_{2};
    Exec exec_{&pool_, DotOrder::kBlock, nullptr};
};

TEST_F(CpuBackendTest, BuffersAreAlignedHostMemoryThatMoves) {
    auto a = cpu().alloc(1000);
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    EXPECT_EQ(a->bytes(), 1000u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data()) % 64, 0u);
    const std::vector<float> in = random_floats(250, 1);
    ASSERT_TRUE(cpu().copy_in(a->data(), in.data(), 1000, exec_).ok());
    Buffer moved = std::move(*a);
    EXPECT_EQ(a->data(), nullptr);
    std::vector<float> out(250);
    ASSERT_TRUE(cpu().copy_out(out.data(), moved.data(), 1000, exec_).ok());
    EXPECT_TRUE(same_bits(in, out));
    auto none = cpu().alloc(0);
    ASSERT_TRUE(none.ok());
    EXPECT_EQ(none->data(), nullptr);
}

TEST_F(CpuBackendTest, NormRopeSiluAddAndEmbedAreTheKernelsBits) {
    const int64_t n = 37, d = 192, ld = 200;
    const std::vector<float> x = random_floats(n * ld, 2), w = random_floats(d, 3);
    std::vector<float> got(n * ld, 0.0f), want(n * ld, 0.0f);
    ASSERT_TRUE(
        cpu().rms_norm_rows(x.data(), ld, w.data(), d, n, 1e-5f, got.data(), ld, exec_).ok());
    for (int64_t t = 0; t < n; ++t)
        rms_norm(want.data() + t * ld, x.data() + t * ld, w.data(), d, 1e-5f);
    EXPECT_TRUE(same_bits(got, want));

    std::vector<int32_t> pos(n);
    std::iota(pos.begin(), pos.end(), 1000);
    for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kSplitHalf}) {
        got = x;
        want = x;
        ASSERT_TRUE(
            cpu().rope_rows(got.data(), ld, n, 3, 64, pos.data(), 10000.0f, style, exec_).ok());
        for (int64_t t = 0; t < n; ++t) rope(want.data() + t * ld, 3, 64, pos[t], 10000.0f, style);
        EXPECT_TRUE(same_bits(got, want));
    }

    const int64_t m = 50000;  // more than one of the pool's splits
    const std::vector<float> g = random_floats(m, 4), u = random_floats(m, 5);
    got.assign(m, 0.0f);
    want.assign(m, 0.0f);
    ASSERT_TRUE(cpu().silu_mul(got.data(), g.data(), u.data(), m, exec_).ok());
    silu_mul(want.data(), g.data(), u.data(), m);
    EXPECT_TRUE(same_bits(got, want));
    got = g;
    want = g;
    ASSERT_TRUE(cpu().add(got.data(), u.data(), m, exec_).ok());
    add_inplace(want.data(), u.data(), m);
    EXPECT_TRUE(same_bits(got, want));

    // An embedding table in Q8_0: rows dequantized as the forward pass looks them up.
    const int64_t rows = 100, cols = 64;
    const std::vector<float> table_f = random_floats(rows * cols, 6);
    std::vector<uint8_t> q(row_bytes(DType::kQ8_0, cols) * rows);
    for (int64_t r = 0; r < rows; ++r)
        quantize_row(DType::kQ8_0, table_f.data() + r * cols,
                     q.data() + r * row_bytes(DType::kQ8_0, cols), cols);
    const WeightMatrix table{DType::kQ8_0, rows, cols, q.data(), 1};
    const int32_t tokens[] = {0, 99, 42, 42};
    got.assign(4 * cols, 0.0f);
    want.assign(4 * cols, 0.0f);
    ASSERT_TRUE(cpu().embed_rows(table, tokens, 4, got.data(), exec_).ok());
    for (int i = 0; i < 4; ++i) dequantize_weight_row(table, tokens[i], want.data() + i * cols);
    EXPECT_TRUE(same_bits(got, want));
}

// RoPE scaling (RopeParams): llama3's per-pair factors and linear scaling turn pair j of a
// head at pos by freq_scale * pos * base^(-2j/d) / factor_j, as ggml_rope_ext does; factors
// of 1 and a scale of 1 are plain RoPE to the bit; broken params are refused.
TEST_F(CpuBackendTest, RopeScalingTurnsByEachPairsFactor) {
    const int n_heads = 3, hd = 16;
    const int64_t n = 20, ld = n_heads * hd + 5;
    const std::vector<float> x = random_floats(n * ld, 11);
    std::vector<int32_t> pos(n);
    std::iota(pos.begin(), pos.end(), 3);
    const std::vector<float> ones(hd / 2, 1.0f);
    const std::vector<float> factors = {1.0f, 1.0f, 1.3f, 2.5f, 6.0f, 8.0f, 8.0f, 8.0f};
    for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kSplitHalf}) {
        std::vector<float> got = x, want = x;
        ASSERT_TRUE(cpu()
                        .rope_rows(got.data(), ld, n, n_heads, hd, pos.data(),
                                   RopeParams{500000.0f, style, 1.0f, ones}, exec_)
                        .ok());
        ASSERT_TRUE(
            cpu()
                .rope_rows(want.data(), ld, n, n_heads, hd, pos.data(), 500000.0f, style, exec_)
                .ok());
        EXPECT_TRUE(same_bits(got, want)) << "factors of 1 are plain RoPE";

        const float scale = 0.25f;
        got = x;
        ASSERT_TRUE(cpu()
                        .rope_rows(got.data(), ld, n, n_heads, hd, pos.data(),
                                   RopeParams{500000.0f, style, scale, factors}, exec_)
                        .ok());
        double worst = 0;
        for (int64_t t = 0; t < n; ++t) {
            for (int h = 0; h < n_heads; ++h) {
                for (int j = 0; j < hd / 2; ++j) {
                    const double theta =
                        scale * pos[t] * std::pow(500000.0, -2.0 * j / hd) / factors[j];
                    const int64_t at = t * ld + h * hd;
                    const int i0 = style == RopeStyle::kInterleaved ? 2 * j : j;
                    const int i1 = style == RopeStyle::kInterleaved ? 2 * j + 1 : j + hd / 2;
                    const double a = x[at + i0], b = x[at + i1];
                    worst = std::max(worst, std::fabs(got[at + i0] -
                                                      (a * std::cos(theta) - b * std::sin(theta))));
                    worst = std::max(worst, std::fabs(got[at + i1] -
                                                      (a * std::sin(theta) + b * std::cos(theta))));
                }
            }
            for (int64_t i = n_heads * hd; i < ld; ++i) EXPECT_EQ(got[t * ld + i], x[t * ld + i]);
        }
        EXPECT_LT(worst, 1e-5);
    }

    float row[hd] = {};
    const int32_t p0 = 7;
    const auto refused = [&](const RopeParams& p, const char* why) {
        const Status st = cpu().rope_rows(row, hd, 1, 1, hd, &p0, p, exec_);
        EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << why;
    };
    const std::vector<float> short_factors(hd / 2 - 1, 1.0f);
    std::vector<float> nan_factor = factors;
    nan_factor[2] = NAN;
    std::vector<float> zero_factor = factors;
    zero_factor[0] = 0.0f;
    refused(RopeParams{1e4f, RopeStyle::kInterleaved, 1.0f, short_factors}, "too few factors");
    refused(RopeParams{1e4f, RopeStyle::kInterleaved, 1.0f, nan_factor}, "a NaN factor");
    refused(RopeParams{1e4f, RopeStyle::kInterleaved, 1.0f, zero_factor}, "a zero factor");
    refused(RopeParams{1e4f, RopeStyle::kInterleaved, INFINITY, {}}, "an infinite scale");
    refused(RopeParams{-1.0f, RopeStyle::kInterleaved, 1.0f, {}}, "a negative base");
}

// Gemma's GeGLU (tanh GELU) and the embedding's scale against their formulas in double; the
// CUDA backend's against the CPU's (skipped without a device).
TEST_F(CpuBackendTest, GeluMulAndScaleAreTheirFormulas) {
    const int64_t m = 40000;
    std::vector<float> g = random_floats(m, 13), u = random_floats(m, 14);
    for (int64_t i = 0; i < m; i += 97) g[i] *= 8.0f;  // the tails too
    std::vector<float> got(m);
    ASSERT_TRUE(cpu().gelu_mul(got.data(), g.data(), u.data(), m, exec_).ok());
    double worst = 0;
    for (int64_t i = 0; i < m; ++i) {
        const double x = g[i];
        const double gelu =
            0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
        worst = std::max(worst, std::fabs(got[i] - gelu * u[i]) / (1.0 + std::fabs(gelu * u[i])));
    }
    EXPECT_LT(worst, 1e-6);
    std::vector<float> x = g;
    ASSERT_TRUE(cpu().scale(x.data(), 8.0f, m, exec_).ok());
    for (int64_t i = 0; i < m; ++i) ASSERT_EQ(x[i], g[i] * 8.0f);
}

TEST_F(CpuBackendTest, CudaGeluMulAndScaleMatchTheCpu) {
    Backend* cuda = find_backend("cuda");
    if (cuda == nullptr || !cuda->available()) GTEST_SKIP() << "no CUDA device";
    const int64_t m = 40000;
    const std::vector<float> g = random_floats(m, 13), u = random_floats(m, 14);
    std::vector<float> got(m), x = g;
    ASSERT_TRUE(cpu().gelu_mul(got.data(), g.data(), u.data(), m, exec_).ok());
    ASSERT_TRUE(cpu().scale(x.data(), 8.0f, m, exec_).ok());
    const Exec on_gpu{};
    auto dg = cuda->alloc(m * 4), du = cuda->alloc(m * 4), dout = cuda->alloc(m * 4);
    ASSERT_TRUE(dg.ok() && du.ok() && dout.ok());
    ASSERT_TRUE(cuda->copy_in(dg->data(), g.data(), m * 4, on_gpu).ok());
    ASSERT_TRUE(cuda->copy_in(du->data(), u.data(), m * 4, on_gpu).ok());
    ASSERT_TRUE(cuda->gelu_mul(dout->f32(), dg->f32(), du->f32(), m, on_gpu).ok());
    ASSERT_TRUE(cuda->scale(dg->f32(), 8.0f, m, on_gpu).ok());
    std::vector<float> cg(m), cs(m);
    ASSERT_TRUE(cuda->copy_out(cg.data(), dout->data(), m * 4, on_gpu).ok());
    ASSERT_TRUE(cuda->copy_out(cs.data(), dg->data(), m * 4, on_gpu).ok());
    double worst = 0;
    for (int64_t i = 0; i < m; ++i) worst = std::max(worst, double(std::fabs(cg[i] - got[i])));
    EXPECT_LT(worst, 1e-5);
    EXPECT_TRUE(same_bits(cs, x));
}

// The CUDA backend's rope_rows with factors and a scale against the CPU's (skips without a
// device).
TEST_F(CpuBackendTest, CudaRopeScalingMatchesTheCpu) {
    Backend* cuda = find_backend("cuda");
    if (cuda == nullptr || !cuda->available()) GTEST_SKIP() << "no CUDA device";
    const int n_heads = 4, hd = 64;
    const int64_t n = 9, ld = n_heads * hd + 8;
    const std::vector<float> x = random_floats(n * ld, 12);
    std::vector<int32_t> pos(n);
    std::iota(pos.begin(), pos.end(), 4000);
    std::vector<float> factors(hd / 2);
    for (int j = 0; j < hd / 2; ++j) factors[j] = 1.0f + 0.25f * j;
    for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kSplitHalf}) {
        const RopeParams p{500000.0f, style, 0.5f, factors};
        std::vector<float> want = x, got(x.size());
        ASSERT_TRUE(cpu().rope_rows(want.data(), ld, n, n_heads, hd, pos.data(), p, exec_).ok());
        auto d = cuda->alloc(x.size() * sizeof(float));
        ASSERT_TRUE(d.ok());
        const Exec on_gpu{};
        ASSERT_TRUE(cuda->copy_in(d->data(), x.data(), x.size() * 4, on_gpu).ok());
        ASSERT_TRUE(cuda->rope_rows(d->f32(), ld, n, n_heads, hd, pos.data(), p, on_gpu).ok());
        ASSERT_TRUE(cuda->copy_out(got.data(), d->data(), x.size() * 4, on_gpu).ok());
        double worst = 0;
        for (size_t i = 0; i < x.size(); ++i)
            worst = std::max(worst, double(std::fabs(got[i] - want[i])));
        EXPECT_LT(worst, 1e-5) << int(style);
    }
}

TEST_F(CpuBackendTest, MatmulAndAttentionAreTheKernelsBits) {
    const int64_t rows = 96, cols = 128, n = 5;
    const std::vector<float> wf = random_floats(rows * cols, 7);
    std::vector<uint8_t> q(row_bytes(DType::kQ4_0, cols) * rows);
    for (int64_t r = 0; r < rows; ++r)
        quantize_row(DType::kQ4_0, wf.data() + r * cols,
                     q.data() + r * row_bytes(DType::kQ4_0, cols), cols);
    const WeightMatrix host{DType::kQ4_0, rows, cols, q.data(), 1};
    auto w = cpu().upload_weight(host);
    ASSERT_TRUE(w.ok());
    EXPECT_EQ(w->data, host.data) << "the CPU reads the model's own weights";
    const std::vector<float> x = random_floats(n * cols, 8);
    for (DotOrder order : {DotOrder::kBlock, DotOrder::kGgml}) {
        Exec exec = exec_;
        exec.order = order;
        std::vector<float> got(n * rows), want(n * rows), got2(n * rows), want2(n * rows);
        ASSERT_TRUE(cpu().matmul(*w, x.data(), cols, n, got.data(), rows, exec).ok());
        matmul(host, x.data(), cols, n, want.data(), rows, pool_, order);
        EXPECT_TRUE(same_bits(got, want));
        const MatmulOutput outs[] = {{&*w, got.data(), rows}, {&*w, got2.data(), rows}};
        ASSERT_TRUE(cpu().matmul_shared_input(outs, x.data(), cols, n, exec).ok());
        const MatmulOutput ref[] = {{&host, want.data(), rows}, {&host, want2.data(), rows}};
        matmul_shared_input(ref, x.data(), cols, n, pool_, order);
        EXPECT_TRUE(same_bits(got, want));
        EXPECT_TRUE(same_bits(got2, want2));
    }

    // Attention over fp32 rows through a slot map, 4 query heads over 2 KV heads.
    const AttentionShape shape{4, 2, 64, 0.125f};
    const int32_t n_kv = 40, n_q = 3;
    const std::vector<float> k = random_floats(n_kv * 128, 9), v = random_floats(n_kv * 128, 10);
    std::vector<int32_t> slots(n_kv);
    std::iota(slots.rbegin(), slots.rend(), 0);
    KvView view;
    view.dtype = DType::kF32;
    view.k = reinterpret_cast<const uint8_t*>(k.data());
    view.v = reinterpret_cast<const uint8_t*>(v.data());
    view.row_stride = 128 * sizeof(float);
    view.head_stride = 64 * sizeof(float);
    view.slots = slots.data();
    view.n = n_kv;
    const std::vector<float> qv = random_floats(n_q * 256, 11);
    std::vector<float> got(n_q * 256), want(n_q * 256);
    ASSERT_TRUE(cpu().attention(shape, view, qv.data(), 256, n_q, got.data(), 256, exec_).ok());
    attention(shape, view, qv.data(), 256, n_q, want.data(), 256, pool_);
    EXPECT_TRUE(same_bits(got, want));
}

TEST_F(CpuBackendTest, TopKIsAFullSortsHead) {
    const int64_t vocab = 1000, rows = 3;
    std::vector<float> logits = random_floats(vocab * rows, 12);
    logits[5] = logits[6] = 50.0f;  // a tie: the lower id first
    logits[7] = std::nanf("");      // NaN sorts last
    std::vector<int32_t> ids(rows * 10);
    std::vector<float> values(rows * 10);
    ASSERT_TRUE(cpu().top_k(logits.data(), vocab, rows, 10, ids.data(), values.data(), exec_).ok());
    for (int64_t r = 0; r < rows; ++r) {
        std::vector<int32_t> all(vocab);
        std::iota(all.begin(), all.end(), 0);
        const float* row = logits.data() + r * vocab;
        std::stable_sort(all.begin(), all.end(), [&](int32_t a, int32_t b) {
            const float ka = std::isnan(row[a]) ? -INFINITY : row[a];
            const float kb = std::isnan(row[b]) ? -INFINITY : row[b];
            return ka > kb;
        });
        for (int j = 0; j < 10; ++j) {
            EXPECT_EQ(ids[r * 10 + j], all[j]) << r << " " << j;
            EXPECT_EQ(values[r * 10 + j], row[all[j]]);
        }
    }
    EXPECT_EQ(ids[0], 5);
    EXPECT_EQ(ids[1], 6);
    EXPECT_EQ(cpu().top_k(logits.data(), vocab, 1, 0, ids.data(), values.data(), exec_).code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(cpu().top_k(logits.data(), vocab, 1, 1001, ids.data(), values.data(), exec_).code(),
              StatusCode::kInvalidArgument);
}

TEST_F(CpuBackendTest, AnExecWithoutThreadsIsRefused) {
    const Exec none;
    float x[64] = {}, w[64] = {};
    EXPECT_EQ(cpu().rms_norm_rows(x, 64, w, 64, 1, 1e-5f, x, 64, none).code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(cpu().silu_mul(x, x, x, 64, none).code(), StatusCode::kInvalidArgument);
}

// A backend that implements none of the forward pass's ops says so for each.
class NothingBackend final : public Backend {
  public:
    std::string_view name() const override { return "nothing"; }
    bool available() const override { return true; }
};

TEST(BackendDefaults, OpsNotImplementedSaySo) {
    NothingBackend b;
    const Exec exec;
    float x[4] = {};
    int32_t id = 0;
    EXPECT_EQ(b.alloc(16).status().code(), StatusCode::kResourceExhausted);
    EXPECT_EQ(b.copy_in(x, x, 4, exec).code(), StatusCode::kUnimplemented);
    EXPECT_EQ(b.upload_weight(WeightMatrix{}).status().code(), StatusCode::kUnimplemented);
    EXPECT_EQ(b.matmul(WeightMatrix{}, x, 1, 1, x, 1, exec).code(), StatusCode::kUnimplemented);
    EXPECT_EQ(b.add(x, x, 4, exec).code(), StatusCode::kUnimplemented);
    EXPECT_EQ(b.top_k(x, 4, 1, 1, &id, x, exec).code(), StatusCode::kUnimplemented);
    const Status s = b.attention(AttentionShape{}, KvView{}, x, 1, 1, x, 1, exec);
    EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
    EXPECT_NE(s.message().find("nothing: attention"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace deltaserve::kernels
