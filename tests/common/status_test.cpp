#include "deltaserve/common/status.h"

#include <gtest/gtest.h>

#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <random>

#include "deltaserve/common/fp16.h"
#include "deltaserve/common/mapped_file.h"

namespace deltaserve {
namespace {

Result<int> half(int x) {
    if (x % 2 != 0) return invalid_argument("odd: " + std::to_string(x));
    return x / 2;
}

Result<int> quarter(int x) {
    DS_ASSIGN_OR_RETURN(int h, half(x));
    DS_ASSIGN_OR_RETURN(int q, half(h));
    return q;
}

TEST(Status, PropagatesThroughAssignOrReturn) {
    EXPECT_EQ(*quarter(8), 2);
    auto r = quarter(6);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(r.error().to_string(), "INVALID_ARGUMENT: odd: 3");
    EXPECT_EQ(r.error().with_context("loading x").message(), "loading x: odd: 3");
}

TEST(MappedFile, MissingAndEmptyFilesAreClearErrors) {
    auto missing = MappedFile::open("/nonexistent/deltaserve/file");
    ASSERT_FALSE(missing.ok());
    EXPECT_EQ(missing.error().code(), StatusCode::kNotFound);
    auto dir = MappedFile::open("/tmp");
    EXPECT_FALSE(dir.ok());
}

TEST(Fp16, MatchesTheF16cInstructionsBitForBit) {
    std::mt19937 rng(1);
    std::uniform_int_distribution<uint32_t> bits;
    for (int i = 0; i < 200000; ++i) {
        uint32_t b = bits(rng);
        if (i % 2) b = (b & 0x807fffffu) | ((100u + b % 60u) << 23);  // mostly half's range
        float f;
        std::memcpy(&f, &b, 4);
        if (std::isnan(f)) continue;
        ASSERT_EQ(fp32_to_fp16(f), _cvtss_sh(f, 0)) << f;
        const uint16_t h = static_cast<uint16_t>(b);
        if ((h & 0x7c00) != 0x7c00) ASSERT_EQ(fp16_to_fp32(h), _cvtsh_ss(h)) << h;
    }
    EXPECT_EQ(bf16_to_fp32(fp32_to_bf16(3.0f)), 3.0f);
}

}  // namespace
}  // namespace deltaserve
