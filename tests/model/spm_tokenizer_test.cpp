// SentencePiece-style tokenizers: llama2.c's tokenizer.bin (checked against a literal port of
// run.c's encode) and GGUF "llama" vocabularies (a small handmade one).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "deltaserve/model/tokenizer.h"
#include "test_paths.h"

namespace deltaserve::model {
namespace {

using Ids = std::vector<int32_t>;
namespace fs = std::filesystem;

// run.c's encode, kept literal (quadratic merge loop, linear lookups) as the reference.
Ids run_c_encode(const Vocab& v, const std::string& text, bool bos) {
    auto lookup = [&](const std::string& s) -> int32_t {
        for (size_t i = 0; i < v.tokens.size(); ++i) {
            if (v.tokens[i] == s) return static_cast<int32_t>(i);
        }
        return -1;
    };
    Ids tokens;
    if (bos) tokens.push_back(1);
    if (!text.empty()) tokens.push_back(lookup(" "));
    std::string buf;
    for (size_t c = 0; c < text.size(); ++c) {
        if ((text[c] & 0xC0) != 0x80) buf.clear();
        buf += text[c];
        if (c + 1 < text.size() && (text[c + 1] & 0xC0) == 0x80 && buf.size() < 4) continue;
        const int32_t id = lookup(buf);
        if (id != -1) {
            tokens.push_back(id);
        } else {
            for (unsigned char b : buf) tokens.push_back(b + 3);
        }
        buf.clear();
    }
    while (true) {
        float best_score = -1e10f;
        int32_t best_id = -1, best_idx = -1;
        for (size_t i = 0; i + 1 < tokens.size(); ++i) {
            const int32_t id = lookup(v.tokens[tokens[i]] + v.tokens[tokens[i + 1]]);
            if (id != -1 && v.scores[id] > best_score) {
                best_score = v.scores[id];
                best_id = id;
                best_idx = static_cast<int32_t>(i);
            }
        }
        if (best_idx == -1) break;
        tokens[best_idx] = best_id;
        tokens.erase(tokens.begin() + best_idx + 1);
    }
    return tokens;
}

class Llama2cTokenizerTest : public ::testing::Test {
  protected:
    void SetUp() override {
        path_ = testing::stories_tokenizer();
        DS_REQUIRE_FILE(path_, "tok512.bin");
        auto tok = load_llama2c_tokenizer(path_, 512);
        ASSERT_TRUE(tok.ok()) << tok.error().to_string();
        tok_ = std::move(*tok);
    }

    // A copy of the tokenizer file cut to n bytes (or patched by fn), in a temp folder.
    std::string write_variant(const std::string& name, size_t n,
                              void (*patch)(std::string*) = nullptr) {
        std::ifstream in(path_, std::ios::binary);
        std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        data.resize(std::min(n, data.size()));
        if (patch) patch(&data);
        dir_ = fs::temp_directory_path() / ("ds_spm_test_" + std::to_string(getpid()));
        fs::create_directories(dir_);
        const std::string out = (dir_ / name).string();
        std::ofstream(out, std::ios::binary).write(data.data(), data.size());
        return out;
    }
    void TearDown() override {
        if (!dir_.empty()) fs::remove_all(dir_);
    }

    std::string path_;
    fs::path dir_;
    std::unique_ptr<Tokenizer> tok_;
};

TEST_F(Llama2cTokenizerTest, OnceUponATimeRoundTrips) {
    auto ids = tok_->encode("Once upon a time", /*add_bos=*/true, false);
    ASSERT_TRUE(ids.ok());
    ASSERT_GE(ids->size(), 2u);
    EXPECT_EQ((*ids)[0], 1);  // BOS
    EXPECT_EQ(*ids, run_c_encode(tok_->vocab(), "Once upon a time", true));
    EXPECT_EQ(tok_->decode(*ids), "Once upon a time");  // the dummy prefix's space is dropped
    auto no_bos = tok_->encode("Once upon a time", /*add_bos=*/false, false);
    ASSERT_TRUE(no_bos.ok());
    EXPECT_EQ(*no_bos, Ids(ids->begin() + 1, ids->end()));
    EXPECT_EQ(tok_->decode(*no_bos), " Once upon a time");
}

TEST_F(Llama2cTokenizerTest, MatchesRunC) {
    for (const std::string text :
         {"", " ", "Lily's mom said, \"Lily, let's go to the park.\"",
          "Tom and Sam were best friends.\nThey played every day!", "  two  spaces   ",
          "caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80 ~]", "12345 + 67 = 12412"}) {
        for (bool bos : {false, true}) {
            auto ids = tok_->encode(text, bos, false);
            ASSERT_TRUE(ids.ok());
            EXPECT_EQ(*ids, run_c_encode(tok_->vocab(), text, bos)) << "text: " << text;
            std::string want = text.empty() ? "" : (bos ? text : " " + text);
            EXPECT_EQ(tok_->decode(*ids), want);
        }
    }
}

TEST_F(Llama2cTokenizerTest, VocabularyLayout) {
    const Vocab& v = tok_->vocab();
    EXPECT_EQ(tok_->vocab_size(), 512);
    EXPECT_EQ(tok_->bos_id(), 1);
    EXPECT_EQ(tok_->eos_id(), 2);
    EXPECT_TRUE(tok_->is_eog(2));
    EXPECT_EQ(v.tokens[3], "<0x00>");
    EXPECT_EQ(tok_->token_to_piece(3 + 'A'), "A");  // byte tokens decode to the byte
    EXPECT_EQ(tok_->token_to_piece(1), "");         // BOS / EOS render as nothing
    EXPECT_EQ(tok_->token_to_piece(2, 5), "");
}

TEST_F(Llama2cTokenizerTest, TruncatedFilesGiveDataLoss) {
    for (size_t n : {size_t{0}, size_t{2}, size_t{4}, size_t{9}, size_t{100}, size_t{6226}}) {
        const std::string cut = write_variant("cut.bin", n);
        auto tok = load_llama2c_tokenizer(cut, 512);
        ASSERT_FALSE(tok.ok()) << n;
        EXPECT_EQ(tok.error().code(), StatusCode::kDataLoss) << n;
        EXPECT_NE(tok.error().message().find(cut), std::string::npos) << tok.error().message();
    }
    // Asking for more tokens than the file has is the same error.
    EXPECT_EQ(load_llama2c_tokenizer(path_, 513).error().code(), StatusCode::kDataLoss);
}

TEST_F(Llama2cTokenizerTest, CorruptLengthsGiveDataLoss) {
    auto negative_len = [](std::string* d) {
        const int32_t len = -5;
        std::memcpy(d->data() + 8, &len, 4);  // token 0's length
    };
    const std::string bad = write_variant("neg.bin", 1 << 20, negative_len);
    auto tok = load_llama2c_tokenizer(bad, 512);
    ASSERT_FALSE(tok.ok());
    EXPECT_EQ(tok.error().code(), StatusCode::kDataLoss);
    EXPECT_NE(tok.error().message().find("token 0"), std::string::npos);
}

TEST_F(Llama2cTokenizerTest, MissingFileAndBadSize) {
    EXPECT_EQ(load_llama2c_tokenizer("/no/such/tokenizer.bin", 512).error().code(),
              StatusCode::kNotFound);
    EXPECT_EQ(load_llama2c_tokenizer(path_, 0).error().code(), StatusCode::kInvalidArgument);
}

TEST_F(Llama2cTokenizerTest, InvalidUtf8) {
    auto ids = tok_->encode("ok\xC3", true, false);
    ASSERT_FALSE(ids.ok());
    EXPECT_EQ(ids.error().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(ids.error().message().find("offset 2"), std::string::npos);
}

// --- GGUF "llama" vocabularies -----------------------------------------------------------

// <unk> <s> </s>, the 256 byte tokens, then pieces with scores.
Vocab spm_vocab() {
    Vocab v;
    auto add = [&](const std::string& text, float score, TokenType type) {
        v.tokens.push_back(text);
        v.scores.push_back(score);
        v.types.push_back(type);
    };
    add("<unk>", 0, TokenType::kUnknown);
    add("<s>", 0, TokenType::kControl);
    add("</s>", 0, TokenType::kControl);
    for (int b = 0; b < 256; ++b) {
        char hex[8];
        std::snprintf(hex, sizeof(hex), "<0x%02X>", b);
        add(hex, 0, TokenType::kByte);
    }
    const char* pieces[] = {"\xE2\x96\x81",
                            "h",
                            "e",
                            "l",
                            "o",
                            "w",
                            "r",
                            "d",
                            "\xE2\x96\x81h",
                            "he",
                            "ll",
                            "llo",
                            "\xE2\x96\x81he",
                            "\xE2\x96\x81hello",
                            "wor",
                            "or",
                            "\xE2\x96\x81w",
                            "\xE2\x96\x81world",
                            "ld"};
    float score = -1;
    for (const char* p : pieces) add(p, score -= 1, TokenType::kNormal);
    v.scores[v.tokens.size() - 6] = -0.5f;  // "▁hello" merges ahead of everything
    v.unk_id = 0;
    v.bos_id = 1;
    v.eos_id = 2;
    v.add_bos = true;
    return v;
}

int32_t id_of(const Vocab& v, const std::string& text) {
    for (size_t i = 0; i < v.tokens.size(); ++i) {
        if (v.tokens[i] == text) return static_cast<int32_t>(i);
    }
    return -1;
}

TEST(SpmTokenizerTest, MergesByScoreWithSpacePrefix) {
    const Vocab v = spm_vocab();
    auto tok = make_spm_tokenizer(v);
    ASSERT_TRUE(tok.ok()) << tok.error().to_string();
    auto ids = (*tok)->encode("hello world", /*add_bos=*/true, false);
    ASSERT_TRUE(ids.ok());
    // "▁hello" scores highest; in "▁world", "or" (-17) beats "▁w" (-18), so "▁world" is
    // never reached.
    EXPECT_EQ(*ids, (Ids{1, id_of(v, "\xE2\x96\x81hello"), id_of(v, "\xE2\x96\x81"),
                         id_of(v, "wor"), id_of(v, "ld")}));
    EXPECT_EQ((*tok)->decode(*ids), "hello world");
}

TEST(SpmTokenizerTest, UnknownCharactersFallBackToBytes) {
    const Vocab v = spm_vocab();
    auto tok = make_spm_tokenizer(v);
    ASSERT_TRUE(tok.ok());
    auto ids = (*tok)->encode("h\xC3\xA9", false, false);  // "hé"
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, (Ids{id_of(v, "\xE2\x96\x81h"), 3 + 0xC3, 3 + 0xA9}));
    EXPECT_EQ((*tok)->decode(*ids), "h\xC3\xA9");
}

TEST(SpmTokenizerTest, SpecialTokensAndNoSpacePrefix) {
    Vocab v = spm_vocab();
    auto tok = make_spm_tokenizer(v);
    ASSERT_TRUE(tok.ok());
    // A space prefix follows a special token, as in llama.cpp.
    auto ids = (*tok)->encode("</s>hello", false, /*parse_special=*/true);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, (Ids{2, id_of(v, "\xE2\x96\x81hello")}));
    EXPECT_EQ((*tok)->decode(*ids, /*render_special=*/true), "</s> hello");
    v.add_space_prefix = false;
    auto no_prefix = make_spm_tokenizer(v);
    ASSERT_TRUE(no_prefix.ok());
    auto plain = (*no_prefix)->encode("he", false, false);
    ASSERT_TRUE(plain.ok());
    EXPECT_EQ(*plain, (Ids{id_of(v, "he")}));
}

TEST(SpmTokenizerTest, RejectsMismatchedArrays) {
    Vocab v = spm_vocab();
    v.scores.pop_back();
    EXPECT_EQ(make_spm_tokenizer(v).error().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace deltaserve::model
