// The "cuda" backend's forward-pass ops against the CPU backend, the reference, on random
// inputs with fixed seeds. Every test but the first skips without the backend (not built) or
// a device. The NMSE bounds, and why each holds:
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "deltaserve/common/fp16.h"
#include "deltaserve/common/thread_pool.h"
#include "deltaserve/kernels/backend.h"
#include "deltaserve/kernels/quant.h"
#include "deltaserve/kernels/repack.h"
#include "random_blocks.h"
#include "random_data.h"

namespace deltaserve::kernels {
namespace {

// Matmul against the CPU: the quantized types take the same int8 activations (the same
// rounding) and the same exact block sums, the float types the same fp32 products; only the
// order in which blocks (elements) are added differs, ~1e-14.
constexpr double kMatmulVsCpu = 1e-10;
// Matmul of the int8 types against float64 products of the dequantized weights and the
// fp32 x: the activations' rounding, uniform within +-d/2 with d = max|x| / 127 per 32
// values, so err^2 / x^2 ~ (max|x| / 127)^2 / 12 / var(x) ~ 3e-5 for Gaussian x.
constexpr double kInt8VsExact = 1e-4;
constexpr double kFloatVsExact = 1e-10;
// The types the device multiplies in fp32 (random_blocks_only) against the CPU, which rounds
// their activations to int8: 2.5e-5 to 7.5e-5 measured (MatmulQuantTypes.MatchFloat64).
constexpr double kCpuInt8VsFp32 = 3e-4;
// rms_norm_rows, rope_rows, embed_rows, silu_mul: the reference's roundings step for step;
// they may differ in the last bit where the CPU build contracts a multiply-add or its
// sinf/cosf/exp round otherwise (a few ulp on a few elements: ~1e-14).
constexpr double kSameRoundings = 1e-12;
// Attention: fp32 dot products, exps and weighted sums in another order and another exp
// (the CPU's is a 1.5 ulp polynomial) over up to 5000 keys: ~1e-12.
constexpr double kAttention = 1e-8;

using testing::random_floats;

// Values as a KV cache stores them: fp16 or fp32.
std::vector<uint8_t> kv_bytes(const std::vector<float>& f, DType dtype) {
    const size_t elem = dtype == DType::kF16 ? 2 : 4;
    std::vector<uint8_t> out(f.size() * elem);
    for (size_t i = 0; i < f.size(); ++i) {
        if (dtype == DType::kF16) {
            const uint16_t h = fp32_to_fp16(f[i]);
            std::memcpy(out.data() + 2 * i, &h, 2);
        } else {
            std::memcpy(out.data() + 4 * i, &f[i], 4);
        }
    }
    return out;
}

double nmse(const std::vector<float>& got, const std::vector<float>& want) {
    double num = 0.0;
    double den = 0.0;
    for (size_t i = 0; i < want.size(); ++i) {
        const double d = static_cast<double>(got[i]) - want[i];
        num += d * d;
        den += static_cast<double>(want[i]) * want[i];
    }
    return den > 0.0 ? num / den : num;  // NaN in got fails every bound
}

// Rows [0, n) of width w out of rows ld apart.
std::vector<float> rows_of(const std::vector<float>& v, int64_t n, int64_t w, int64_t ld) {
    std::vector<float> out;
    for (int64_t t = 0; t < n; ++t)
        out.insert(out.end(), v.begin() + t * ld, v.begin() + t * ld + w);
    return out;
}

const char* kNotBuilt = "CUDA backend not built (DELTASERVE_CUDA=OFF or no nvcc)";

// Without a device every op says so before it looks at its arguments.
TEST(CudaForwardOpsNoDevice, OpsAreUnavailable) {
    Backend* cuda = find_backend("cuda");
    if (cuda == nullptr) GTEST_SKIP() << kNotBuilt;
    if (cuda->available()) GTEST_SKIP() << "a CUDA device is present: CudaForwardOps covers it";
    EXPECT_FALSE(cuda->host_memory());
    const auto unavailable = [](const Status& s, const char* op) {
        EXPECT_EQ(s.code(), StatusCode::kUnavailable) << op << ": " << s.to_string();
        EXPECT_NE(s.message().find("no CUDA device"), std::string::npos) << op;
    };
    const Exec exec;
    float x[64] = {};
    int32_t ids[4] = {};
    const WeightMatrix w{DType::kF32, 8, 8, x, 1};
    const MatmulOutput outs[] = {{&w, x, 8}};
    unavailable(cuda->copy_in(x, x, 4, exec), "copy_in");
    unavailable(cuda->copy_out(x, x, 4, exec), "copy_out");
    unavailable(cuda->copy(x, x, 4, exec), "copy");
    unavailable(cuda->upload_weight(w).status(), "upload_weight");
    unavailable(cuda->rms_norm_rows(x, 8, x, 8, 1, 1e-5f, x, 8, exec), "rms_norm_rows");
    unavailable(cuda->matmul(w, x, 8, 1, x, 8, exec), "matmul");
    unavailable(cuda->matmul_shared_input(outs, x, 8, 1, exec), "matmul_shared_input");
    unavailable(cuda->rope_rows(x, 8, 1, 1, 8, ids, 1e4f, RopeStyle::kInterleaved, exec),
                "rope_rows");
    unavailable(cuda->silu_mul(x, x, x, 8, exec), "silu_mul");
    unavailable(cuda->add(x, x, 8, exec), "add");
    unavailable(cuda->embed_rows(w, ids, 1, x, exec), "embed_rows");
    unavailable(cuda->attention(AttentionShape{1, 1, 8, 1.0f}, KvView{}, x, 8, 1, x, 8, exec),
                "attention");
    unavailable(cuda->top_k(x, 8, 1, 0, ids, x, exec), "top_k");  // before k is checked
    auto* bytes = reinterpret_cast<uint8_t*>(x);
    unavailable(cuda->store_rows(DType::kF16, 8, x, 8, 1, bytes, 16, ids, exec), "store_rows");
    unavailable(cuda->copy_rows(bytes, 16, ids, bytes, 16, nullptr, 16, 1, exec), "copy_rows");
    unavailable(cuda->synchronize(exec), "synchronize");
    EXPECT_EQ(cuda->alloc(64).status().code(), StatusCode::kResourceExhausted);
}

struct AttentionCase {
    DType dtype;
    int n_heads, n_kv_heads, head_dim;
    int32_t n_q, n;
};

class CudaForwardOps : public ::testing::Test {
  protected:
    void SetUp() override {
        cuda_ = find_backend("cuda");
        if (cuda_ == nullptr) GTEST_SKIP() << kNotBuilt;
        if (!cuda_->available()) GTEST_SKIP() << "no CUDA device; the forward ops are not checked";
        cpu_ = find_backend("cpu");
    }

    // A device copy of host bytes.
    Buffer device(const void* host, size_t bytes) {
        Result<Buffer> buf = cuda_->alloc(bytes);
        if (!buf.ok()) {
            ADD_FAILURE() << buf.status().to_string();
            return Buffer();
        }
        const Status s = cuda_->copy_in(buf->data(), host, bytes, on_gpu_);
        EXPECT_TRUE(s.ok()) << s.to_string();
        return std::move(*buf);
    }
    template <class T>
    Buffer device(const std::vector<T>& host) {
        return device(host.data(), host.size() * sizeof(T));
    }
    std::vector<float> host(const Buffer& buf) {
        std::vector<float> out(buf.bytes() / sizeof(float));
        const Status s = cuda_->copy_out(out.data(), buf.data(), buf.bytes(), on_gpu_);
        EXPECT_TRUE(s.ok()) << s.to_string();
        return out;
    }
    void check_attention(const AttentionCase& c);

    Backend* cuda_ = nullptr;
    Backend* cpu_ = nullptr;
    ThreadPool pool_{2};
    Exec on_cpu_{&pool_, DotOrder::kBlock, nullptr};
    Exec on_gpu_{};  // the default (per-thread) stream
};

TEST_F(CudaForwardOps, BuffersCopyInOutAndWithin) {
    EXPECT_FALSE(cuda_->host_memory());
    const std::vector<float> in = random_floats(1000, 1);
    Buffer a = device(in);
    Result<Buffer> b = cuda_->alloc(a.bytes());
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    ASSERT_TRUE(cuda_->copy(b->data(), a.data(), a.bytes(), on_gpu_).ok());
    const std::vector<float> out = host(*b);
    EXPECT_EQ(std::memcmp(in.data(), out.data(), a.bytes()), 0);
    Result<Buffer> none = cuda_->alloc(0);
    ASSERT_TRUE(none.ok());
    EXPECT_EQ(none->data(), nullptr);
}

// The types quantize_row does not make (random blocks instead: test_blocks::random_rows).
bool random_blocks_only(DType t) {
    return t == DType::kQ5_0 || t == DType::kQ5_1 || t == DType::kIQ4_NL || t == DType::kQ2_K ||
           t == DType::kQ3_K || t == DType::kQ4_K || t == DType::kQ5_K || t == DType::kQ6_K ||
           t == DType::kIQ4_XS;
}

// rows x cols of type t from random floats, row-major; interleaved by repack_rows if asked.
std::vector<uint8_t> make_weights(DType t, int64_t rows, int64_t cols, bool interleaved,
                                  uint32_t seed, WeightMatrix& w) {
    const std::vector<float> f = random_floats(static_cast<size_t>(rows * cols), seed);
    const size_t stride = row_bytes(t, cols);
    std::vector<uint8_t> bytes(stride * static_cast<size_t>(rows));
    if (random_blocks_only(t)) {
        bytes = test_blocks::random_rows(t, rows, cols, seed, false, 0.05f);
    } else {
        for (int64_t r = 0; r < rows; ++r)
            quantize_row(t, f.data() + r * cols, bytes.data() + r * stride, cols);
    }
    w = WeightMatrix{t, rows, cols, bytes.data(), 1};
    if (!interleaved) return bytes;
    std::vector<uint8_t> packed(bytes.size());
    w = repack_rows(w, packed.data());
    return packed;
}

struct MatmulCase {
    DType type;
    bool interleaved;
    int64_t rows;
    int64_t cols;
};

TEST_F(CudaForwardOps, MatmulMatchesCpuAndExactProducts) {
    // 1056 columns: 33 blocks, more than a warp's lanes; 75 rows: a partial last group.
    const MatmulCase cases[] = {{DType::kF32, false, 75, 100},   {DType::kF16, false, 75, 1056},
                                {DType::kBF16, false, 75, 1056}, {DType::kQ4_0, false, 75, 1056},
                                {DType::kQ4_1, false, 75, 1056}, {DType::kQ8_0, false, 75, 1056},
                                {DType::kQ4_0, true, 72, 1056},  {DType::kQ4_1, true, 72, 1056},
                                {DType::kQ8_0, true, 72, 1056},  {DType::kQ5_0, false, 75, 1056},
                                {DType::kQ5_1, false, 75, 1056}, {DType::kIQ4_NL, false, 75, 1056},
                                {DType::kQ2_K, false, 75, 1024}, {DType::kQ3_K, false, 75, 1024},
                                {DType::kQ4_K, false, 75, 1024}, {DType::kQ5_K, false, 75, 1024},
                                {DType::kQ6_K, false, 75, 1024}, {DType::kIQ4_XS, false, 75, 1024},
                                {DType::kQ4_K, true, 72, 1024},  {DType::kQ6_K, true, 72, 1024}};
    uint32_t seed = 100;
    for (const MatmulCase& c : cases) {
        const std::string label = std::string(dtype_traits(c.type).name) +
                                  (c.interleaved ? " interleaved" : " row-major");
        WeightMatrix w;
        const std::vector<uint8_t> bytes =
            make_weights(c.type, c.rows, c.cols, c.interleaved, ++seed, w);
        Result<WeightMatrix> up = cuda_->upload_weight(w);
        ASSERT_TRUE(up.ok()) << label << ": " << up.status().to_string();
        EXPECT_EQ(up->interleave, 1);
        std::vector<double> wd(static_cast<size_t>(c.rows * c.cols));
        std::vector<float> row(static_cast<size_t>(c.cols));
        for (int64_t r = 0; r < c.rows; ++r) {
            dequantize_weight_row(w, r, row.data());
            std::copy(row.begin(), row.end(), wd.begin() + r * c.cols);
        }
        for (int64_t n : {1, 3, 8, 37}) {
            const int64_t ldx = c.cols + 8, ldy = c.rows + 5;
            const std::vector<float> x = random_floats(static_cast<size_t>(n * ldx), ++seed);
            const std::vector<float> sentinel(static_cast<size_t>(n * ldy), -7.0f);
            Buffer dx = device(x), dy = device(sentinel);
            ASSERT_TRUE(cuda_->matmul(*up, dx.f32(), ldx, n, dy.f32(), ldy, on_gpu_).ok()) << label;
            const std::vector<float> got = host(dy);
            std::vector<float> want = sentinel;
            ASSERT_TRUE(cpu_->matmul(w, x.data(), ldx, n, want.data(), ldy, on_cpu_).ok());
            std::vector<float> exact(static_cast<size_t>(n * c.rows));
            for (int64_t t = 0; t < n; ++t) {
                for (int64_t r = 0; r < c.rows; ++r) {
                    double acc = 0.0;
                    for (int64_t k = 0; k < c.cols; ++k) acc += wd[r * c.cols + k] * x[t * ldx + k];
                    exact[t * c.rows + r] = static_cast<float>(acc);
                }
            }
            const std::vector<float> g = rows_of(got, n, c.rows, ldy);
            // The device multiplies these types' weights with fp32 activations; the CPU with
            // int8 ones: they differ by the CPU's activation rounding.
            const bool fp32_on_device = random_blocks_only(c.type);
            EXPECT_LT(nmse(g, rows_of(want, n, c.rows, ldy)),
                      fp32_on_device ? kCpuInt8VsFp32 : kMatmulVsCpu)
                << label << " n=" << n;
            const bool int8 =
                c.type == DType::kQ4_0 || c.type == DType::kQ4_1 || c.type == DType::kQ8_0;
            EXPECT_LT(nmse(g, exact), int8 ? kInt8VsExact : kFloatVsExact) << label << " n=" << n;
            for (int64_t t = 0; t < n; ++t) {
                for (int64_t r = c.rows; r < ldy; ++r) EXPECT_EQ(got[t * ldy + r], -7.0f) << label;
            }
        }
    }
}

TEST_F(CudaForwardOps, MatmulSharedInputMatchesCpu) {
    const int64_t cols = 512, n = 5;
    WeightMatrix w[3];
    const std::vector<uint8_t> b0 = make_weights(DType::kQ4_0, 40, cols, false, 1, w[0]);
    const std::vector<uint8_t> b1 = make_weights(DType::kQ8_0, 24, cols, true, 2, w[1]);
    const std::vector<uint8_t> b2 = make_weights(DType::kF16, 16, cols, false, 3, w[2]);
    WeightMatrix up[3];
    for (int i = 0; i < 3; ++i) {
        Result<WeightMatrix> u = cuda_->upload_weight(w[i]);
        ASSERT_TRUE(u.ok()) << u.status().to_string();
        up[i] = *u;
    }
    const std::vector<float> x = random_floats(n * cols, 4);
    Buffer dx = device(x);
    std::vector<Buffer> dy;
    std::vector<std::vector<float>> want;
    std::vector<MatmulOutput> gpu_outs, cpu_outs;
    for (int i = 0; i < 3; ++i) {
        want.emplace_back(static_cast<size_t>(n * w[i].rows));
        dy.push_back(device(want.back()));
    }
    for (int i = 0; i < 3; ++i) {
        gpu_outs.push_back({&up[i], dy[i].f32(), w[i].rows});
        cpu_outs.push_back({&w[i], want[i].data(), w[i].rows});
    }
    ASSERT_TRUE(cuda_->matmul_shared_input(gpu_outs, dx.f32(), cols, n, on_gpu_).ok());
    ASSERT_TRUE(cpu_->matmul_shared_input(cpu_outs, x.data(), cols, n, on_cpu_).ok());
    for (int i = 0; i < 3; ++i) EXPECT_LT(nmse(host(dy[i]), want[i]), kMatmulVsCpu) << i;
}

TEST_F(CudaForwardOps, RmsNormRowsMatchesCpu) {
    const int64_t n = 37, d = 1000, ldx = 1010, ldo = 1020;  // d not a multiple of 32
    const std::vector<float> x = random_floats(n * ldx, 5, 3.0f), w = random_floats(d, 6);
    Buffer dx = device(x), dw = device(w), dout = device(std::vector<float>(n * ldo, 0.0f));
    ASSERT_TRUE(
        cuda_->rms_norm_rows(dx.f32(), ldx, dw.f32(), d, n, 1e-5f, dout.f32(), ldo, on_gpu_).ok());
    std::vector<float> want(n * ldo, 0.0f);
    ASSERT_TRUE(
        cpu_->rms_norm_rows(x.data(), ldx, w.data(), d, n, 1e-5f, want.data(), ldo, on_cpu_).ok());
    EXPECT_LT(nmse(rows_of(host(dout), n, d, ldo), rows_of(want, n, d, ldo)), kSameRoundings);
    // In place.
    ASSERT_TRUE(
        cuda_->rms_norm_rows(dx.f32(), ldx, dw.f32(), d, n, 1e-5f, dx.f32(), ldx, on_gpu_).ok());
    EXPECT_LT(nmse(rows_of(host(dx), n, d, ldx), rows_of(want, n, d, ldo)), kSameRoundings);
}

TEST_F(CudaForwardOps, RopeRowsMatchesCpu) {
    // Far positions: the angles must round as the CPU's repeated products do.
    std::vector<int32_t> pos = {0, 1, 2, 7, 31, 100, 511, 4095, 32767, 131071, 500000};
    std::mt19937 rng(7);
    for (int i = 0; i < 9; ++i) pos.push_back(static_cast<int32_t>(rng() % 1000000));
    const int64_t n = static_cast<int64_t>(pos.size());
    struct Shape {
        int n_heads, head_dim;
        int64_t ldx;  // past n_heads * head_dim: left alone
    };
    for (const Shape& sh : {Shape{4, 64, 300}, Shape{2, 128, 256}, Shape{3, 96, 320}}) {
        for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kSplitHalf}) {
            const std::vector<float> x = random_floats(n * sh.ldx, 8);
            Buffer dx = device(x);
            ASSERT_TRUE(cuda_
                            ->rope_rows(dx.f32(), sh.ldx, n, sh.n_heads, sh.head_dim, pos.data(),
                                        10000.0f, style, on_gpu_)
                            .ok());
            std::vector<float> want = x;
            ASSERT_TRUE(cpu_->rope_rows(want.data(), sh.ldx, n, sh.n_heads, sh.head_dim, pos.data(),
                                        10000.0f, style, on_cpu_)
                            .ok());
            const std::vector<float> got = host(dx);
            EXPECT_LT(nmse(got, want), kSameRoundings) << sh.head_dim << " " << int(style);
            for (int64_t t = 0; t < n; ++t) {
                for (int64_t i = int64_t{sh.n_heads} * sh.head_dim; i < sh.ldx; ++i)
                    ASSERT_EQ(got[t * sh.ldx + i], x[t * sh.ldx + i]);
            }
        }
    }
}

TEST_F(CudaForwardOps, SiluMulAndAddMatchCpu) {
    const int64_t n = 100003;
    const std::vector<float> g = random_floats(n, 9, 4.0f), u = random_floats(n, 10);
    Buffer dg = device(g), du = device(u), dout = device(std::vector<float>(n, 0.0f));
    ASSERT_TRUE(cuda_->silu_mul(dout.f32(), dg.f32(), du.f32(), n, on_gpu_).ok());
    std::vector<float> want(n);
    ASSERT_TRUE(cpu_->silu_mul(want.data(), g.data(), u.data(), n, on_cpu_).ok());
    EXPECT_LT(nmse(host(dout), want), kSameRoundings);

    ASSERT_TRUE(cuda_->add(dg.f32(), du.f32(), n, on_gpu_).ok());
    want = g;
    ASSERT_TRUE(cpu_->add(want.data(), u.data(), n, on_cpu_).ok());
    const std::vector<float> got = host(dg);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(float)), 0) << "one rounding each";
}

TEST_F(CudaForwardOps, EmbedRowsMatchCpu) {
    const int32_t tokens[] = {0, 47, 7, 7, 23, 46};
    const int64_t n = 6, cols = 256;
    uint32_t seed = 20;
    for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ4_0, DType::kQ4_1,
                    DType::kQ8_0, DType::kQ5_0, DType::kQ5_1, DType::kIQ4_NL, DType::kQ2_K,
                    DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kIQ4_XS}) {
        for (bool interleaved : {false, true}) {
            if (interleaved && !repackable(WeightMatrix{t, 48, cols, nullptr, 1})) continue;
            WeightMatrix table;
            const std::vector<uint8_t> bytes =
                make_weights(t, 48, cols, interleaved, ++seed, table);
            Result<WeightMatrix> up = cuda_->upload_weight(table);
            ASSERT_TRUE(up.ok()) << up.status().to_string();
            Buffer dout = device(std::vector<float>(n * cols, 0.0f));
            ASSERT_TRUE(cuda_->embed_rows(*up, tokens, n, dout.f32(), on_gpu_).ok());
            std::vector<float> want(n * cols);
            ASSERT_TRUE(cpu_->embed_rows(table, tokens, n, want.data(), on_cpu_).ok());
            EXPECT_LT(nmse(host(dout), want), kSameRoundings)
                << dtype_traits(t).name << (interleaved ? " interleaved" : "");
        }
    }
}

// K and V of n entries in a pool of n + 50 padded rows under a shuffled slot map, the same
// bytes on both backends; then one attention call on each.
void CudaForwardOps::check_attention(const AttentionCase& c) {
    const size_t elem = c.dtype == DType::kF16 ? 2 : 4;
    const int32_t n_slots = c.n + 50;
    const size_t row_stride = static_cast<size_t>(c.n_kv_heads * c.head_dim) * elem + 32;
    const std::vector<float> kf =
        random_floats(static_cast<size_t>(n_slots) * row_stride / elem, 30);
    const std::vector<float> vf = random_floats(kf.size(), 31);
    const std::vector<uint8_t> k = kv_bytes(kf, c.dtype), v = kv_bytes(vf, c.dtype);
    std::vector<int32_t> slots(static_cast<size_t>(n_slots));
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), std::mt19937(32));
    slots.resize(static_cast<size_t>(c.n));

    const AttentionShape shape{c.n_heads, c.n_kv_heads, c.head_dim,
                               1.0f / std::sqrt(static_cast<float>(c.head_dim))};
    const int64_t width = int64_t{c.n_heads} * c.head_dim, ldq = width + 8, ldo = width + 16;
    const std::vector<float> q = random_floats(static_cast<size_t>(c.n_q * ldq), 33, 1.5f);
    const std::vector<float> sentinel(static_cast<size_t>(c.n_q * ldo), -7.0f);
    KvView view;
    view.dtype = c.dtype;
    view.row_stride = row_stride;
    view.head_stride = static_cast<size_t>(c.head_dim) * elem;
    view.slots = slots.data();
    view.n = c.n;
    Buffer dk = device(k), dv = device(v), dq = device(q), dout = device(sentinel);
    KvView on_device = view;
    on_device.k = static_cast<const uint8_t*>(dk.data());
    on_device.v = static_cast<const uint8_t*>(dv.data());
    const Status s =
        cuda_->attention(shape, on_device, dq.f32(), ldq, c.n_q, dout.f32(), ldo, on_gpu_);
    if (c.n < c.n_q) {  // fewer entries than queries
        EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
        return;
    }
    ASSERT_TRUE(s.ok()) << s.to_string();
    view.k = k.data();
    view.v = v.data();
    std::vector<float> want = sentinel;
    ASSERT_TRUE(cpu_->attention(shape, view, q.data(), ldq, c.n_q, want.data(), ldo, on_cpu_).ok());
    const std::vector<float> got = host(dout);
    EXPECT_LT(nmse(rows_of(got, c.n_q, width, ldo), rows_of(want, c.n_q, width, ldo)), kAttention);
    for (int64_t i = 0; i < c.n_q; ++i) {
        for (int64_t d = width; d < ldo; ++d) ASSERT_EQ(got[i * ldo + d], -7.0f);
    }
}

TEST_F(CudaForwardOps, AttentionMatchesCpu) {
    for (DType dtype : {DType::kF16, DType::kF32}) {
        for (auto [heads, kv_heads] : {std::pair{8, 2}, std::pair{4, 4}}) {
            for (int head_dim : {64, 128}) {
                for (int32_t n_q : {1, 17}) {
                    for (int32_t n : {1, 100, 5000}) {
                        SCOPED_TRACE(std::string(dtype_traits(dtype).name) + " " +
                                     std::to_string(heads) + "/" + std::to_string(kv_heads) +
                                     " hd" + std::to_string(head_dim) + " n_q" +
                                     std::to_string(n_q) + " n" + std::to_string(n));
                        check_attention({dtype, heads, kv_heads, head_dim, n_q, n});
                    }
                }
            }
        }
    }
}

// A decode step's batch: five sequences over one pool (their slot lists of 1 to 3000 entries
// drawn from it, one with three queries, one with none), their query rows scattered through
// q and out, in one attention_batch call; each against the CPU backend's attention of its
// own view. Then views of two pools in one call (one launch each).
TEST_F(CudaForwardOps, AttentionBatchMatchesCpuPerSequence) {
    const int n_heads = 8, n_kv_heads = 2, head_dim = 64;
    const int32_t arena = 4000;
    const size_t row_stride = static_cast<size_t>(n_kv_heads * head_dim) * 2;
    const std::vector<float> kf = random_floats(static_cast<size_t>(arena) * row_stride / 2, 80);
    const std::vector<float> vf = random_floats(kf.size(), 81);
    const std::vector<uint8_t> k = kv_bytes(kf, DType::kF16), v = kv_bytes(vf, DType::kF16);
    Buffer dk = device(k), dv = device(v);
    const AttentionShape shape{n_heads, n_kv_heads, head_dim,
                               1.0f / std::sqrt(static_cast<float>(head_dim))};
    const int64_t width = int64_t{n_heads} * head_dim, ld = width;
    const int32_t lens[] = {1, 3000, 257, 40, 12};
    const int32_t n_qs[] = {1, 1, 3, 0, 1};
    const int64_t first_rows[] = {9, 0, 4, 8, 2};  // rows 1, 3 and 7 are no query's
    std::vector<std::vector<int32_t>> lists;
    std::mt19937 rng(82);
    for (int32_t n : lens) {
        std::vector<int32_t> all(static_cast<size_t>(arena));
        std::iota(all.begin(), all.end(), 0);
        std::shuffle(all.begin(), all.end(), rng);
        lists.emplace_back(all.begin(), all.begin() + n);
    }
    const int64_t rows = 10;
    const std::vector<float> q = random_floats(static_cast<size_t>(rows * ld), 83, 1.5f);
    const std::vector<float> sentinel(static_cast<size_t>(rows * ld), -7.0f);
    Buffer dq = device(q);
    for (bool two_pools : {false, true}) {
        Buffer dv2 = device(v);  // the second pool: the same bytes elsewhere
        std::vector<AttentionJob> jobs;
        for (size_t s = 0; s < lists.size(); ++s) {
            KvView view;
            view.dtype = DType::kF16;
            view.k = static_cast<const uint8_t*>(dk.data());
            view.v = static_cast<const uint8_t*>(two_pools && s % 2 == 1 ? dv2.data() : dv.data());
            view.row_stride = row_stride;
            view.head_stride = static_cast<size_t>(head_dim) * 2;
            view.slots = lists[s].data();
            view.n = lens[s];
            jobs.push_back({view, first_rows[s], n_qs[s]});
        }
        Buffer dout = device(sentinel);
        const Status st =
            cuda_->attention_batch(shape, jobs, dq.f32(), ld, dout.f32(), ld, on_gpu_);
        ASSERT_TRUE(st.ok()) << st.to_string();
        const std::vector<float> got = host(dout);
        std::vector<float> want = sentinel;
        for (AttentionJob job : jobs) {
            job.view.k = k.data();
            job.view.v = v.data();
            ASSERT_TRUE(cpu_->attention(shape, job.view, q.data() + job.first_row * ld, ld, job.n_q,
                                        want.data() + job.first_row * ld, ld, on_cpu_)
                            .ok());
        }
        for (size_t s = 0; s < jobs.size(); ++s) {
            if (n_qs[s] == 0) continue;
            const std::vector<float> g(got.begin() + first_rows[s] * ld,
                                       got.begin() + (first_rows[s] + n_qs[s]) * ld);
            const std::vector<float> w(want.begin() + first_rows[s] * ld,
                                       want.begin() + (first_rows[s] + n_qs[s]) * ld);
            EXPECT_LT(nmse(g, w), kAttention)
                << "sequence " << s << (two_pools ? ", two pools" : "");
        }
        for (int64_t r : {1, 3, 7}) {
            for (int64_t d = 0; d < ld; ++d) ASSERT_EQ(got[r * ld + d], -7.0f) << "row " << r;
        }
    }
}

// Per-head entry lists (head_slots): each KV head its own arena of one-head rows and its own
// count; the long lists split the keys over blocks, and the shorter one's last splits are
// empty.
TEST_F(CudaForwardOps, AttentionWithPerHeadEntriesMatchesCpu) {
    const int head_dim = 64;
    const int32_t n_q = 3, arena = 3100;
    for (DType dtype : {DType::kF16, DType::kF32}) {
        for (auto [n0, n1] : {std::pair{300, 257}, std::pair{3000, 2100}}) {
            const size_t elem = dtype == DType::kF16 ? 2 : 4;
            const size_t row_stride = head_dim * elem;
            const size_t values = 2 * static_cast<size_t>(arena) * head_dim;
            const std::vector<float> kf = random_floats(values, 40), vf = random_floats(values, 41);
            const std::vector<uint8_t> k = kv_bytes(kf, dtype), v = kv_bytes(vf, dtype);
            const int32_t head_n[2] = {n0, n1};
            std::vector<int32_t> lists[2];
            for (int g = 0; g < 2; ++g) {
                lists[g].resize(arena);
                std::iota(lists[g].begin(), lists[g].end(), 0);
                std::shuffle(lists[g].begin(), lists[g].end(), std::mt19937(42 + g));
                lists[g].resize(static_cast<size_t>(head_n[g]));
            }
            const int32_t* head_slots[2] = {lists[0].data(), lists[1].data()};
            const AttentionShape shape{8, 2, head_dim, 0.125f};
            const int64_t width = 8 * head_dim;
            const std::vector<float> q = random_floats(n_q * width, 43, 1.5f);
            KvView view;
            view.dtype = dtype;
            view.row_stride = row_stride;
            view.head_stride = static_cast<size_t>(arena) * row_stride;
            view.head_slots = head_slots;
            view.head_n = head_n;
            Buffer dk = device(k), dv = device(v), dq = device(q),
                   dout = device(std::vector<float>(n_q * width, 0.0f));
            KvView on_device = view;
            on_device.k = static_cast<const uint8_t*>(dk.data());
            on_device.v = static_cast<const uint8_t*>(dv.data());
            ASSERT_TRUE(
                cuda_->attention(shape, on_device, dq.f32(), width, n_q, dout.f32(), width, on_gpu_)
                    .ok());
            view.k = k.data();
            view.v = v.data();
            std::vector<float> want(n_q * width);
            ASSERT_TRUE(
                cpu_->attention(shape, view, q.data(), width, n_q, want.data(), width, on_cpu_)
                    .ok());
            EXPECT_LT(nmse(host(dout), want), kAttention) << n0 << "/" << n1;
        }
    }
}

// ids equal, values bit for bit (NaN included); k past 1024 takes the host path.
TEST_F(CudaForwardOps, TopKMatchesCpu) {
    const int64_t vocab = 5000, rows = 3;
    std::vector<float> logits = random_floats(vocab * rows, 50);
    logits[5] = logits[6] = logits[4000] = 50.0f;  // ties: the lower id first
    logits[7] = std::nanf("");                     // NaN sorts last
    float* r1 = logits.data() + vocab;
    for (int i = 0; i < 300; ++i) r1[i * 7] = std::nanf("");
    r1[1] = r1[2] = -INFINITY;
    r1[3] = INFINITY;
    std::fill(logits.begin() + 2 * vocab, logits.end(), 0.5f);  // all equal: id order
    logits[2 * vocab + 10] = std::nanf("");
    Buffer d = device(logits);
    for (int32_t k : {1, 40, 1024, 1025, 5000}) {
        std::vector<int32_t> ids(rows * k, -1), want_ids(rows * k, -2);
        std::vector<float> values(rows * k), want_values(rows * k);
        const Status s = cuda_->top_k(d.f32(), vocab, rows, k, ids.data(), values.data(), on_gpu_);
        ASSERT_TRUE(s.ok()) << s.to_string();
        ASSERT_TRUE(
            cpu_->top_k(logits.data(), vocab, rows, k, want_ids.data(), want_values.data(), on_cpu_)
                .ok());
        EXPECT_EQ(ids, want_ids) << "k=" << k;
        EXPECT_EQ(std::memcmp(values.data(), want_values.data(), values.size() * sizeof(float)), 0)
            << "k=" << k;
    }
}

// KV rows stored at their slots and copied between slot lists: the same bytes as the CPU
// backend's (fp16 rounding to nearest even on both), in 16-byte words and in bytes.
TEST_F(CudaForwardOps, StoreRowsAndCopyRowsMatchCpu) {
    constexpr int64_t kWidth = 192, kLd = 200, kN = 37, kArenaRows = 64;
    const std::vector<float> src = random_floats(static_cast<size_t>(kN * kLd), 70);
    std::vector<int32_t> slots(kArenaRows);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), std::mt19937(71));
    slots.resize(kN);
    Buffer d_src = device(src);
    for (DType dtype : {DType::kF16, DType::kF32}) {
        const size_t stride = row_bytes(dtype, kWidth) + 16;  // rows with a gap between
        std::vector<uint8_t> want(stride * kArenaRows, 0);
        ASSERT_TRUE(cpu_->store_rows(dtype, kWidth, src.data(), kLd, kN, want.data(), stride,
                                     slots.data(), on_cpu_)
                        .ok());
        Buffer arena = device(std::vector<uint8_t>(want.size(), 0));
        auto* a = static_cast<uint8_t*>(arena.data());
        const Status st = cuda_->store_rows(dtype, kWidth, d_src.f32(), kLd, kN, a, stride,
                                            slots.data(), on_gpu_);
        ASSERT_TRUE(st.ok()) << st.to_string();
        std::vector<uint8_t> got(want.size());
        ASSERT_TRUE(cuda_->copy_out(got.data(), a, got.size(), on_gpu_).ok());
        EXPECT_EQ(got, want) << "store_rows " << (dtype == DType::kF16 ? "f16" : "f32");

        // Gather the slots (16-byte words), scatter them back shifted, and rows of 6 bytes at
        // odd offsets (bytes); each against the CPU backend on the same arena.
        std::vector<int32_t> to(slots.rbegin(), slots.rend());
        for (auto [row, offset] : {std::pair<size_t, size_t>{stride, 0}, {6, 3}}) {
            std::vector<uint8_t> cpu_out(want.size(), 0);
            ASSERT_TRUE(cpu_->copy_rows(cpu_out.data() + offset, stride, to.data(),
                                        want.data() + offset, stride, slots.data(), row - offset,
                                        kN, on_cpu_)
                            .ok());
            Buffer out = device(std::vector<uint8_t>(want.size(), 0));
            auto* o = static_cast<uint8_t*>(out.data());
            ASSERT_TRUE(cuda_
                            ->copy_rows(o + offset, stride, to.data(), a + offset, stride,
                                        slots.data(), row - offset, kN, on_gpu_)
                            .ok());
            std::vector<uint8_t> gpu_out(want.size());
            ASSERT_TRUE(cuda_->copy_out(gpu_out.data(), o, gpu_out.size(), on_gpu_).ok());
            EXPECT_EQ(gpu_out, cpu_out) << "copy_rows of " << row - offset << " bytes";
        }
    }
}

TEST_F(CudaForwardOps, BadArgumentsAreInvalid) {
    const auto invalid = [](const Status& s, const char* what) {
        EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << what << ": " << s.to_string();
    };
    const std::vector<float> zeros(4096, 0.0f);
    Buffer d = device(zeros);
    int32_t ids[8];
    float values[8];
    invalid(cuda_->top_k(d.f32(), 100, 1, 0, ids, values, on_gpu_), "top_k k=0");
    invalid(cuda_->top_k(d.f32(), 100, 1, 101, ids, values, on_gpu_), "top_k k>n_vocab");

    // Types with no kernel (activation formats, never a file's weights).
    const std::vector<uint8_t> q8(292 * 4, 0);
    const Status q8k =
        cuda_->upload_weight(WeightMatrix{DType::kQ8_K, 4, 256, q8.data(), 1}).status();
    invalid(q8k, "upload Q8_K");
    EXPECT_NE(q8k.message().find("Q8_K"), std::string::npos) << q8k.message();
    invalid(cuda_->upload_weight(WeightMatrix{DType::kQ8_1, 4, 256, q8.data(), 1}).status(),
            "upload Q8_1");

    WeightMatrix host;
    const std::vector<uint8_t> packed = make_weights(DType::kQ4_0, 8, 64, true, 60, host);
    invalid(cuda_->matmul(host, d.f32(), 64, 1, d.f32(), 8, on_gpu_), "matmul on a host layout");
    Result<WeightMatrix> up = cuda_->upload_weight(host);
    ASSERT_TRUE(up.ok()) << up.status().to_string();
    invalid(cuda_->matmul(*up, d.f32(), 32, 1, d.f32(), 8, on_gpu_), "matmul ldx < cols");
    const int32_t bad_token = 8;
    invalid(cuda_->embed_rows(*up, &bad_token, 1, d.f32(), on_gpu_), "embed_rows token >= rows");

    const int32_t pos = 0;
    invalid(cuda_->rope_rows(d.f32(), 64, 1, 1, 3, &pos, 1e4f, RopeStyle::kInterleaved, on_gpu_),
            "rope_rows head_dim 3");
    const int32_t slot = 0;
    KvView view;
    view.k = view.v = static_cast<const uint8_t*>(d.data());
    view.row_stride = 1024;
    view.slots = &slot;
    view.n = 1;
    invalid(cuda_->attention(AttentionShape{1, 1, 260, 1.0f}, view, d.f32(), 260, 1, d.f32(), 260,
                             on_gpu_),
            "attention head_dim 260");
    auto* bytes = static_cast<uint8_t*>(d.data());
    const int32_t negative = -1;
    invalid(cuda_->store_rows(DType::kF16, 8, d.f32(), 8, 1, bytes, 16, &negative, on_gpu_),
            "store_rows at a negative slot");
    invalid(cuda_->store_rows(DType::kQ4_0, 32, d.f32(), 32, 1, bytes, 64, &slot, on_gpu_),
            "store_rows as Q4_0");
    invalid(cuda_->store_rows(DType::kF32, 8, d.f32(), 8, 1, bytes, 16, &slot, on_gpu_),
            "store_rows into rows shorter than theirs");
    invalid(cuda_->copy_rows(bytes, 16, &negative, bytes, 16, nullptr, 16, 1, on_gpu_),
            "copy_rows to a negative row");
}

}  // namespace
}  // namespace deltaserve::kernels
