// What a client sees of generated text: whole UTF-8 characters, and stop strings cut off
// even when they arrive split over several tokens.
#include <gtest/gtest.h>

#include "deltaserve/decode/text_stream.h"

namespace deltaserve::decode {
namespace {

TEST(TextStream, PiecesEndOnCharacterBoundaries) {
    EXPECT_EQ(complete_utf8_prefix("abc"), 3u);
    EXPECT_EQ(complete_utf8_prefix(""), 0u);
    const std::string euro = "\xe2\x82\xac";  // 3 bytes
    EXPECT_EQ(complete_utf8_prefix("a" + euro), 4u);
    EXPECT_EQ(complete_utf8_prefix("a" + euro.substr(0, 2)), 1u);
    EXPECT_EQ(complete_utf8_prefix("a" + euro.substr(0, 1)), 1u);
    const std::string face = "\xf0\x9f\x98\x80";  // 4 bytes
    EXPECT_EQ(complete_utf8_prefix(face.substr(0, 3)), 0u);
    EXPECT_EQ(complete_utf8_prefix(face), 4u);
}

TEST(TextStream, StopStringSplitOverPiecesIsCutOff) {
    StopScanner s({"END"});
    std::string out;
    for (const char* piece : {"Hello E", "N", "D and more"}) {
        const bool stopped = s.add(piece);
        out += s.release(stopped);
        if (stopped) break;
    }
    EXPECT_EQ(out, "Hello ");
    EXPECT_EQ(s.text(), "Hello ");
}

TEST(TextStream, HeldBackTextIsReleasedAtTheEnd) {
    StopScanner s({"STOP"});
    std::string out;
    EXPECT_FALSE(s.add("abc ST"));
    out += s.release(false);
    EXPECT_EQ(out, "abc");  // "ST" may start the stop string
    out += s.release(true);
    EXPECT_EQ(out, "abc ST");
    StopScanner half({});
    EXPECT_FALSE(half.add("x\xe2\x82"));
    EXPECT_EQ(half.release(false), "x");  // the euro sign is not whole yet
    EXPECT_FALSE(half.add("\xac"));
    EXPECT_EQ(half.release(false), "\xe2\x82\xac");
}

}  // namespace
}  // namespace deltaserve::decode
