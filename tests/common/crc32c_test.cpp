#include "deltaserve/common/crc32c.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace deltaserve {
namespace {

std::span<const uint8_t> bytes_of(const std::string& s) {
    return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// RFC 3720 (iSCSI) B.4's check value and its test vectors.
TEST(Crc32c, MatchesTheStandardsCheckValues) {
    EXPECT_EQ(crc32c(bytes_of("123456789")), 0xE3069283u);
    EXPECT_EQ(crc32c(std::vector<uint8_t>(32, 0)), 0x8A9136AAu);
    EXPECT_EQ(crc32c(std::vector<uint8_t>(32, 0xFF)), 0x62A8AB43u);
    std::vector<uint8_t> up(32);
    for (int i = 0; i < 32; ++i) up[i] = static_cast<uint8_t>(i);
    EXPECT_EQ(crc32c(up), 0x46DD794Eu);
    EXPECT_EQ(crc32c({}), 0u);
}

// The hardware path (three interleaved streams past 12 KiB) equals the table for every
// length around its boundaries, and extending a CRC piece by piece equals one call.
TEST(Crc32c, HardwareEqualsTableAndExtends) {
    std::mt19937 rng(3);
    std::vector<uint8_t> data(3 * 3 * 4096 + 77);
    for (auto& b : data) b = static_cast<uint8_t>(rng());
    for (size_t n :
         {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{4096}, size_t{3 * 4096 - 1},
          size_t{3 * 4096}, size_t{3 * 4096 + 1}, size_t{6 * 4096 + 13}, data.size()}) {
        const std::span<const uint8_t> s(data.data(), n);
        EXPECT_EQ(crc32c(s), crc32c_portable(s)) << n << " bytes";
    }
    const std::span<const uint8_t> all(data);
    for (size_t cut : {size_t{1}, size_t{5000}, size_t{12288}, size_t{20000}}) {
        EXPECT_EQ(crc32c(all.subspan(cut), crc32c(all.first(cut))), crc32c(all)) << cut;
    }
    // One flipped bit anywhere changes it.
    const uint32_t clean = crc32c(all);
    for (size_t at : {size_t{0}, size_t{12287}, size_t{12288}, data.size() - 1}) {
        data[at] ^= 0x10;
        EXPECT_NE(crc32c(all), clean) << at;
        data[at] ^= 0x10;
    }
}

}  // namespace
}  // namespace deltaserve
