// deltactl calibrate's texts: gzip files read as Debian ships them, broken ones refused by
// name, and the sequences taken from each text: the share asked for, spread along the text.
#include <gtest/gtest.h>
#include <zlib.h>

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <string>

#include "calibration_text.h"

namespace deltaserve::ops {
namespace {

namespace fs = std::filesystem;

class ReadTextTest : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() / ("calibration_text_" + std::to_string(::getpid()));
        fs::create_directories(dir_);
        for (int i = 0; i < 2000; ++i) text_ += "Line " + std::to_string(i) + " of the manual.\n";
    }
    void TearDown() override {
        std::error_code ec;
        fs::remove_all(dir_, ec);
    }
    std::string gzip_file(const std::string& name) {
        const std::string path = (dir_ / name).string();
        gzFile f = gzopen(path.c_str(), "wb");
        EXPECT_NE(f, nullptr);
        EXPECT_EQ(gzwrite(f, text_.data(), static_cast<unsigned>(text_.size())),
                  static_cast<int>(text_.size()));
        gzclose(f);
        return path;
    }
    fs::path dir_;
    std::string text_;
};

TEST_F(ReadTextTest, ReadsPlainAndGzipFiles) {
    const std::string plain = (dir_ / "manual.txt").string();
    std::ofstream(plain, std::ios::binary) << text_;
    auto a = read_text(plain);
    ASSERT_TRUE(a.ok()) << a.error().message();
    EXPECT_EQ(*a, text_);
    auto b = read_text(gzip_file("manual.txt.gz"));
    ASSERT_TRUE(b.ok()) << b.error().message();
    EXPECT_EQ(*b, text_);
}

TEST_F(ReadTextTest, RefusesMissingAndTruncatedFilesByName) {
    auto missing = read_text((dir_ / "none.txt.gz").string());
    ASSERT_FALSE(missing.ok());
    EXPECT_NE(missing.error().message().find("none.txt.gz"), std::string::npos);

    const std::string path = gzip_file("cut.txt.gz");
    fs::resize_file(path, fs::file_size(path) / 2);
    auto cut = read_text(path);
    ASSERT_FALSE(cut.ok());
    EXPECT_NE(cut.error().message().find("cut.txt.gz"), std::string::npos) << cut.error().message();
}

int64_t total(const std::vector<TokenSpan>& spans) {
    int64_t n = 0;
    for (const TokenSpan& s : spans) n += s.size;
    return n;
}

TEST(SpreadSequencesTest, TakesTheShareInSequencesSpreadAlongTheText) {
    // 4096 tokens out of 100000, at most 2048 per sequence: two sequences, each centred in
    // its half of the text, none past its end, none overlapping.
    const auto spans = spread_sequences(100000, 4096, 2048, 64);
    ASSERT_EQ(spans.size(), 2u);
    EXPECT_EQ(total(spans), 4096);
    EXPECT_EQ(spans[0].begin, (50000 - 2048) / 2);
    EXPECT_EQ(spans[1].begin, 50000 + (50000 - 2048) / 2);

    // A share that is not a whole number of sequences is split evenly, not into a full
    // sequence and a sliver.
    const auto uneven = spread_sequences(100000, 2100, 2048, 64);
    ASSERT_EQ(uneven.size(), 2u);
    EXPECT_EQ(uneven[0].size, 1050);
    EXPECT_EQ(uneven[1].size, 1050);

    for (const auto& set : {spans, uneven, spread_sequences(5000, 4999, 512, 64)}) {
        for (size_t i = 0; i < set.size(); ++i) {
            EXPECT_GE(set[i].begin, 0);
            EXPECT_LE(set[i].size, 2048);
            if (i > 0) {
                EXPECT_GE(set[i].begin, set[i - 1].begin + set[i - 1].size);
            }
        }
        EXPECT_LE(set.back().begin + set.back().size, set.size() == 2 ? 100000 : 5000);
    }
}

TEST(SpreadSequencesTest, ATextShorterThanItsShareIsTakenWhole) {
    const auto spans = spread_sequences(3000, 8192, 2048, 64);
    ASSERT_EQ(spans.size(), 2u);
    EXPECT_EQ(spans[0].begin, 0);
    EXPECT_EQ(spans[0].size, 1500);
    EXPECT_EQ(spans[1].begin, 1500);
    EXPECT_EQ(spans[1].size, 1500);
}

TEST(SpreadSequencesTest, LeavesOutSequencesShorterThanTheMinimum) {
    EXPECT_TRUE(spread_sequences(40, 1000, 2048, 64).empty());
    EXPECT_TRUE(spread_sequences(100000, 0, 2048, 64).empty());
    // Whole sequences only (as TRIM-KV's recording asks): 1000 tokens in sequences of 512
    // are two of 500, both too short.
    EXPECT_TRUE(spread_sequences(100000, 1000, 512, 512).empty());
    EXPECT_EQ(spread_sequences(100000, 1024, 512, 512).size(), 2u);
}

}  // namespace
}  // namespace deltaserve::ops
