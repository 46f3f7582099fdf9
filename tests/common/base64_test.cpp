#include "deltaserve/common/base64.h"

#include <gtest/gtest.h>

#include <random>

namespace deltaserve {
namespace {

TEST(Base64Test, EncodesAsRfc4648) {
    // RFC 4648, section 10.
    const std::pair<const char*, const char*> vectors[] = {{"", ""},
                                                           {"f", "Zg=="},
                                                           {"fo", "Zm8="},
                                                           {"foo", "Zm9v"},
                                                           {"foob", "Zm9vYg=="},
                                                           {"fooba", "Zm9vYmE="},
                                                           {"foobar", "Zm9vYmFy"}};
    for (const auto& [plain, coded] : vectors) {
        EXPECT_EQ(base64_encode(plain), coded);
        EXPECT_EQ(base64_decode(coded).value(), plain);
    }
    EXPECT_EQ(base64_encode(std::string("\xff\xfe\x00", 3)), "//4A");
}

TEST(Base64Test, EveryByteStringRoundTrips) {
    std::mt19937 rng(7);
    for (int n = 0; n < 300; ++n) {
        std::string s(static_cast<size_t>(n), '\0');
        for (char& c : s) c = static_cast<char>(rng());
        EXPECT_EQ(base64_decode(base64_encode(s)).value(), s) << n;
    }
}

TEST(Base64Test, RefusesWhatIsNotStrictBase64) {
    for (const char* bad :
         {"Zg", "Zg=", "Z===", "====", "Zm9v!A==", "Zm=v", "Zh==", "Zm9=", "Zg==Zg==", "Zm9v\n"}) {
        EXPECT_FALSE(base64_decode(bad).ok()) << bad;
    }
}

}  // namespace
}  // namespace deltaserve
