// The backend registry, and the CUDA backend against the CPU reference (ops.h).
// The CUDA tests skip when the backend was not built or no device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "deltaserve/kernels/backend.h"
#include "deltaserve/kernels/ops.h"

namespace deltaserve::kernels {
namespace {

// ---- registry ----

class NamedOnlyBackend final : public Backend {
  public:
    explicit NamedOnlyBackend(std::string name) : name_(std::move(name)) {}
    std::string_view name() const override { return name_; }
    bool available() const override { return true; }

  private:
    std::string name_;
};

TEST(BackendRegistry, UnknownNameIsNull) {
    EXPECT_EQ(find_backend("no-such-backend"), nullptr);
    EXPECT_EQ(find_backend(""), nullptr);
}

TEST(BackendRegistry, CpuIsAlwaysThere) {
    Backend* cpu = find_backend("cpu");
    ASSERT_NE(cpu, nullptr);
    EXPECT_EQ(cpu->name(), "cpu");
    EXPECT_TRUE(cpu->available());
}

TEST(BackendRegistry, RegistersByNameAndRejectsDuplicates) {
    Status first = register_backend(std::make_unique<NamedOnlyBackend>("test-only"));
    ASSERT_TRUE(first.ok() || first.code() == StatusCode::kAlreadyExists)  // --gtest_repeat
        << first.to_string();
    Backend* b = find_backend("test-only");
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b->name(), "test-only");
    const auto names = backend_names();
    EXPECT_NE(std::find(names.begin(), names.end(), "test-only"), names.end());

    Status again = register_backend(std::make_unique<NamedOnlyBackend>("cpu"));
    EXPECT_EQ(again.code(), StatusCode::kAlreadyExists);
    EXPECT_EQ(find_backend("cpu")->name(), "cpu");
    EXPECT_EQ(register_backend(nullptr).code(), StatusCode::kInvalidArgument);

    // An op the backend does not override is "not implemented", not a crash.
    RmsNormRopeParams p;
    p.n_rows = 1;
    p.d_model = 4;
    float row[4] = {1, 2, 3, 4};
    const float w[4] = {1, 1, 1, 1};
    const int64_t pos = 0;
    EXPECT_EQ(b->rms_norm_rope(p, row, w, &pos, row).code(), StatusCode::kUnimplemented);
}

TEST(BackendRegistry, ValidateRejectsBadShapes) {
    RmsNormRopeParams p;
    p.n_rows = 1;
    p.d_model = 64;
    p.n_heads = 2;
    p.head_dim = 32;
    EXPECT_TRUE(validate(p).ok());
    p.head_dim = 33;
    EXPECT_EQ(validate(p).code(), StatusCode::kInvalidArgument);
    p.head_dim = 64;  // 2 * 64 > 64
    EXPECT_EQ(validate(p).code(), StatusCode::kInvalidArgument);
    p.head_dim = 2048;
    EXPECT_EQ(validate(p).code(), StatusCode::kInvalidArgument);
    p = RmsNormRopeParams();
    EXPECT_EQ(validate(p).code(), StatusCode::kInvalidArgument);  // d_model 0
}

// Without a device the CUDA backend must say so, not crash.
TEST(CudaBackend, UnavailableWithoutDeviceIsAStatus) {
    Backend* cuda = find_backend("cuda");
    if (cuda == nullptr) GTEST_SKIP() << "CUDA backend not built (DELTASERVE_CUDA=OFF or no nvcc)";
    EXPECT_EQ(cuda->name(), "cuda");
    if (cuda->available()) GTEST_SKIP() << "a CUDA device is present; covered by CudaParity";
    RmsNormRopeParams p;
    p.n_rows = 1;
    p.d_model = 8;
    p.n_heads = 1;
    p.head_dim = 8;
    std::vector<float> x(8, 1.0f), w(8, 1.0f), out(8);
    const int64_t pos = 3;
    Status s = cuda->rms_norm_rope(p, x.data(), w.data(), &pos, out.data());
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.to_string();
    EXPECT_NE(s.message().find("no CUDA device"), std::string::npos) << s.message();
    EXPECT_FALSE(cuda->available());  // stable across calls
}

// ---- parity ----

struct ParityCase {
    const char* label;
    int64_t d_model;
    int n_heads;
    int head_dim;
    RopeStyle style;
};

void PrintTo(const ParityCase& c, std::ostream* os) { *os << c.label; }

// The reference: ops.h row by row.
std::vector<float> reference(const RmsNormRopeParams& p, const std::vector<float>& x,
                             const std::vector<float>& w, const std::vector<int64_t>& pos) {
    std::vector<float> out(x.size());
    for (int64_t r = 0; r < p.n_rows; ++r) {
        float* row = out.data() + r * p.d_model;
        rms_norm(row, x.data() + r * p.d_model, w.data(), p.d_model, p.eps);
        if (p.n_heads > 0) rope(row, p.n_heads, p.head_dim, pos[r], p.rope_base, p.style);
    }
    return out;
}

struct Errors {
    double nmse;
    double max_abs;  // max |got - want|
    double max_ref;  // max |want|
};

Errors compare(const std::vector<float>& got, const std::vector<float>& want) {
    double num = 0.0;
    double den = 0.0;
    double max_abs = 0.0;
    double max_ref = 0.0;
    for (size_t i = 0; i < want.size(); ++i) {
        const double d = static_cast<double>(got[i]) - want[i];
        num += d * d;
        den += static_cast<double>(want[i]) * want[i];
        max_abs = std::max(max_abs, std::abs(d));
        max_ref = std::max(max_ref, std::abs(static_cast<double>(want[i])));
    }
    return {den > 0.0 ? num / den : num, max_abs, max_ref};
}

constexpr double kMaxNmse = 1e-10;
// Max abs error relative to the largest reference value (~80 float ulps of it). Only the
// order of the sum of squares differs from the reference; a CPU emulation of the kernel's
// reduction tree gave NMSE <= 1.4e-13 and max abs <= 6e-7 * max|ref| on these shapes.
constexpr double kMaxAbsRel = 1e-5;

class CudaParity : public ::testing::TestWithParam<ParityCase> {
  protected:
    void SetUp() override {
        cuda_ = find_backend("cuda");
        if (cuda_ == nullptr) {
            GTEST_SKIP() << "CUDA backend not built (DELTASERVE_CUDA=OFF or no nvcc)";
        }
        if (!cuda_->available()) GTEST_SKIP() << "no CUDA device; parity not checked";
    }
    Backend* cuda_ = nullptr;
};

TEST_P(CudaParity, MatchesCpuReference) {
    const ParityCase& c = GetParam();
    // Several positions, small and large (large angles stress sin/cos range reduction).
    const std::vector<int64_t> positions = {0, 1, 2, 7, 31, 100, 511, 4095, 32767, 131071, 500000};
    RmsNormRopeParams p;
    p.n_rows = static_cast<int64_t>(positions.size());
    p.d_model = c.d_model;
    p.n_heads = c.n_heads;
    p.head_dim = c.head_dim;
    p.eps = 1e-6f;
    p.rope_base = 10000.0f;
    p.style = c.style;

    std::mt19937 rng(1234);
    std::normal_distribution<float> normal(0.0f, 2.0f);
    std::uniform_real_distribution<float> uniform(0.5f, 1.5f);
    std::vector<float> x(static_cast<size_t>(p.n_rows * p.d_model));
    std::vector<float> w(static_cast<size_t>(p.d_model));
    for (float& v : x) v = normal(rng);
    for (float& v : w) v = uniform(rng);

    const std::vector<float> want = reference(p, x, w, positions);

    std::vector<float> got(x.size(), -1.0f);
    Status s = cuda_->rms_norm_rope(p, x.data(), w.data(), positions.data(), got.data());
    ASSERT_TRUE(s.ok()) << s.to_string();
    const Errors e = compare(got, want);
    EXPECT_LT(e.nmse, kMaxNmse) << c.label;
    EXPECT_LT(e.max_abs, kMaxAbsRel * e.max_ref) << c.label;

    // In place (out aliases x) gives the same answer.
    std::vector<float> inplace = x;
    s = cuda_->rms_norm_rope(p, inplace.data(), w.data(), positions.data(), inplace.data());
    ASSERT_TRUE(s.ok()) << s.to_string();
    const Errors e2 = compare(inplace, want);
    EXPECT_LT(e2.nmse, kMaxNmse) << c.label << " (in place)";
    EXPECT_LT(e2.max_abs, kMaxAbsRel * e2.max_ref) << c.label << " (in place)";
}

TEST_F(CudaParity, ZeroRowsIsANoOp) {
    RmsNormRopeParams p;
    p.d_model = 64;
    p.n_heads = 2;
    p.head_dim = 32;
    EXPECT_TRUE(cuda_->rms_norm_rope(p, nullptr, nullptr, nullptr, nullptr).ok());
}

TEST_F(CudaParity, RejectsBadShapes) {
    RmsNormRopeParams p;
    p.n_rows = 1;
    p.d_model = 64;
    p.n_heads = 1;
    p.head_dim = 33;
    std::vector<float> x(64, 1.0f), w(64, 1.0f);
    const int64_t pos = 0;
    EXPECT_EQ(cuda_->rms_norm_rope(p, x.data(), w.data(), &pos, x.data()).code(),
              StatusCode::kInvalidArgument);
}

constexpr auto kI = RopeStyle::kInterleaved;
constexpr auto kS = RopeStyle::kSplitHalf;

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaParity,
    ::testing::Values(
        // Every element rotated.
        ParityCase{"d64_h2x32_interleaved", 64, 2, 32, kI},
        ParityCase{"d64_h2x32_split", 64, 2, 32, kS},
        // Width not a multiple of 32, with an unrotated tail (3 * 42 = 126 of 197).
        ParityCase{"d197_h3x42_interleaved", 197, 3, 42, kI},
        ParityCase{"d197_h3x42_split", 197, 3, 42, kS},
        // Norm only.
        ParityCase{"d100_norm_only", 100, 0, 0, kI},
        // Llama-like: q of 32 heads x 128, wider than one block of threads.
        ParityCase{"d4096_h32x128_interleaved", 4096, 32, 128, kI},
        ParityCase{"d4096_h32x128_split", 4096, 32, 128, kS},
        // Widest head the reference takes.
        ParityCase{"d2100_h2x1024_split", 2100, 2, 1024, kS}),
    [](const ::testing::TestParamInfo<ParityCase>& info) { return std::string(info.param.label); });

}  // namespace
}  // namespace deltaserve::kernels
