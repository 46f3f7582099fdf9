#include "deltaserve/common/byte_size.h"

#include <gtest/gtest.h>

namespace deltaserve {
namespace {

TEST(ByteSize, ParsesWhatPeopleWrite) {
    const std::pair<const char*, uint64_t> cases[] = {
        {"65536", 65536},        {"100B", 100},
        {"4GiB", 4ull << 30},    {"4G", 4ull << 30},
        {"4gb", 4ull << 30},     {"512MiB", 512ull << 20},
        {"512 M", 512ull << 20}, {"1.5G", 3ull << 29},
        {"2T", 2ull << 40},      {"8k", 8192},
    };
    for (const auto& [text, bytes] : cases) {
        auto v = parse_byte_size(text);
        ASSERT_TRUE(v.ok()) << text << ": " << v.status().message();
        EXPECT_EQ(*v, bytes) << text;
    }
}

TEST(ByteSize, RefusesWhatIsNotASize) {
    for (const char* text :
         {"", "GiB", "-1G", "4X", "4 GiBs", "1.2.3", "99999999999999999999", "2048T", "0x10"}) {
        auto v = parse_byte_size(text);
        ASSERT_FALSE(v.ok()) << text;
        EXPECT_EQ(v.status().code(), StatusCode::kInvalidArgument) << text;
    }
}

TEST(ByteSize, FormatsInTheLargestUnit) {
    EXPECT_EQ(format_byte_size(100), "100 B");
    EXPECT_EQ(format_byte_size(3ull << 29), "1.5 GiB");
    EXPECT_EQ(format_byte_size(512ull << 20), "512 MiB");
}

}  // namespace
}  // namespace deltaserve
