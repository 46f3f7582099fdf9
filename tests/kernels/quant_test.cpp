// dequantize_row against the gguf Python package's dequantization (the oracle of ggml's
// dequantize_row_*), bit for bit, on random blocks of every supported block type.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "deltaserve/kernels/dtype.h"
#include "deltaserve/kernels/quant.h"
#include "random_blocks.h"
#include "test_paths.h"

namespace deltaserve::kernels {
namespace {

// Every block type dequantize_row reads.
const DType kBlockTypes[] = {DType::kQ4_0, DType::kQ4_1,   DType::kQ5_0, DType::kQ5_1,
                             DType::kQ8_0, DType::kIQ4_NL, DType::kQ2_K, DType::kQ3_K,
                             DType::kQ4_K, DType::kQ5_K,   DType::kQ6_K, DType::kIQ4_XS};

void write_file(const std::string& path, const void* p, size_t n) {
    std::ofstream f(path, std::ios::binary);
    f.write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
    ASSERT_TRUE(f.good()) << path;
}

std::vector<uint8_t> read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), {}};
}

TEST(DequantizeRow, EqualsTheGgufPackageBitForBit) {
    const std::string python = testing::tools_python();
    DS_REQUIRE_FILE(python, "Python with the gguf package (deploy/setup.sh makes .venv-tools)");
    const std::string script = testing::source_dir() + "/tests/kernels/gguf_dequantize.py";
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() / ("ds_quant_test_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    const int64_t rows = 64, cols = 1024;
    std::string cmd = "'" + python + "' '" + script + "'";
    std::vector<std::vector<uint8_t>> data;
    uint32_t seed = 1;
    for (DType t : kBlockTypes) {
        // Any finite scale, subnormals included.
        data.push_back(test_blocks::random_rows(t, rows, cols, seed++, /*full_range=*/true));
        const std::string name = (dir / std::string(dtype_traits(t).name)).string();
        write_file(name + ".in", data.back().data(), data.back().size());
        cmd += " " + std::to_string(static_cast<uint32_t>(t)) + " " +
               std::to_string(row_bytes(t, cols)) + " '" + name + ".in' '" + name + ".out'";
    }
    const int rc = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << cmd;
    for (size_t i = 0; i < std::size(kBlockTypes); ++i) {
        const DType t = kBlockTypes[i];
        const std::string name = (dir / std::string(dtype_traits(t).name)).string();
        const std::vector<uint8_t> want = read_file(name + ".out");
        ASSERT_EQ(want.size(), static_cast<size_t>(rows * cols) * sizeof(float)) << name;
        std::vector<float> got(rows * cols);
        const size_t rb = row_bytes(t, cols);
        for (int64_t r = 0; r < rows; ++r)
            dequantize_row(t, data[i].data() + r * rb, got.data() + r * cols, cols);
        int64_t first = -1;
        for (int64_t k = 0; k < rows * cols && first < 0; ++k) {
            if (std::memcmp(&got[k], want.data() + 4 * k, 4) != 0) first = k;
        }
        float expected = 0;
        if (first >= 0) std::memcpy(&expected, want.data() + 4 * first, 4);
        EXPECT_EQ(first, -1) << dtype_traits(t).name << ": value " << first << " is "
                             << (first >= 0 ? got[first] : 0) << ", the gguf package's "
                             << expected;
    }
    std::filesystem::remove_all(dir);
}

// A file's scales may be anything: inf and NaN scales give inf or NaN values (never a crash
// or a read outside the block), and the other blocks of the row keep their values.
TEST(DequantizeRow, NonFiniteScalesStayInTheirBlock) {
    const int64_t cols = 512;
    for (DType t : kBlockTypes) {
        std::vector<uint8_t> row = test_blocks::random_rows(t, 1, cols, 7);
        std::vector<float> clean(cols), got(cols);
        dequantize_row(t, row.data(), clean.data(), cols);
        const uint16_t nan = 0x7E00, inf = 0x7C00;
        const int block = dtype_traits(t).block_bytes;
        const int per_block = dtype_traits(t).block_elems;
        const int d_at = test_blocks::half_offsets(t)[0];
        std::memcpy(&row[d_at], &nan, 2);          // block 0's scale NaN
        std::memcpy(&row[block + d_at], &inf, 2);  // block 1's inf
        dequantize_row(t, row.data(), got.data(), cols);
        for (int k = 0; k < per_block; ++k)
            EXPECT_TRUE(std::isnan(got[k])) << dtype_traits(t).name << " " << k;
        int nonfinite = 0;
        for (int k = per_block; k < 2 * per_block; ++k) nonfinite += !std::isfinite(got[k]);
        EXPECT_GT(nonfinite, 0) << dtype_traits(t).name;
        for (int k = 2 * per_block; k < cols; ++k)
            ASSERT_EQ(got[k], clean[k]) << dtype_traits(t).name << " " << k;
    }
}

}  // namespace
}  // namespace deltaserve::kernels
