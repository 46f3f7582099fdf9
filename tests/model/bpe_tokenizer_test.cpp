// Byte-level BPE: small handmade vocabularies for the rules, and SmolLM2's GGUF vocabulary
// against llama.cpp's ids (tests/data/smollm2_tokenize.json, written by
// tests/golden/make_tokenizer_golden.py).
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../../model/src/loader_common.h"
#include "../../model/src/unicode.h"
#include "deltaserve/model/tokenizer.h"
#include "test_paths.h"

namespace deltaserve::model {
namespace {

using Ids = std::vector<int32_t>;

// Raw bytes -> GPT-2's printable form ("a b" -> "aĠb").
std::string mapped(std::string_view raw) {
    std::string out;
    for (char c : raw) unicode::append_utf8(unicode::byte_to_codepoint(uint8_t(c)), &out);
    return out;
}

// 256 byte tokens whose ids are the byte values.
Vocab byte_level_vocab() {
    Vocab v;
    for (int b = 0; b < 256; ++b) v.tokens.push_back(mapped(std::string(1, char(b))));
    v.types.assign(256, TokenType::kNormal);
    v.pre = "gpt2";
    return v;
}

int32_t add_token(Vocab* v, const std::string& text, TokenType type = TokenType::kNormal) {
    v->tokens.push_back(text);
    v->types.push_back(type);
    return static_cast<int32_t>(v->tokens.size() - 1);
}

std::unique_ptr<Tokenizer> make(Vocab v) {
    auto tok = make_bpe_tokenizer(std::move(v));
    EXPECT_TRUE(tok.ok()) << tok.error().to_string();
    return tok.ok() ? std::move(*tok) : nullptr;
}

Ids encode(const Tokenizer& tok, std::string_view text, bool parse_special = true) {
    auto ids = tok.encode(text, /*add_bos=*/false, parse_special);
    EXPECT_TRUE(ids.ok()) << ids.error().to_string();
    return ids.ok() ? *ids : Ids{};
}

TEST(BpeTokenizerTest, MergesLowestRankFirst) {
    Vocab v = byte_level_vocab();
    const int32_t ab = add_token(&v, "ab"), bc = add_token(&v, "bc"), abc = add_token(&v, "abc");
    v.merges = {"b c", "a b", "ab c"};
    EXPECT_EQ(encode(*make(v), "abc"), (Ids{'a', bc}));
    v.merges = {"a b", "b c", "ab c"};
    EXPECT_EQ(encode(*make(v), "abc"), (Ids{abc}));
    EXPECT_EQ(encode(*make(v), "ab"), (Ids{ab}));
}

TEST(BpeTokenizerTest, EqualRanksMergeLeftmostFirst) {
    Vocab v = byte_level_vocab();
    const int32_t aa = add_token(&v, "aa");
    v.merges = {"a a"};
    EXPECT_EQ(encode(*make(v), "aaa"), (Ids{aa, 'a'}));
    EXPECT_EQ(encode(*make(v), "aaaa"), (Ids{aa, aa}));
}

TEST(BpeTokenizerTest, WordsDoNotMergeAcrossPreTokenizerSplits) {
    Vocab v = byte_level_vocab();
    const int32_t space_b = add_token(&v, mapped(" b"));
    add_token(&v, mapped("a "));
    v.merges = {mapped("a") + " " + mapped(" "), mapped(" ") + " b"};
    // "a b" splits into "a" and " b"; the rank-0 merge "a Ġ" never sees its pair.
    EXPECT_EQ(encode(*make(v), "a b"), (Ids{'a', space_b}));
}

TEST(BpeTokenizerTest, DecodesBytesBack) {
    Vocab v = byte_level_vocab();
    add_token(&v, mapped(" h"));
    v.merges = {mapped(" ") + " h"};
    auto tok = make(v);
    const std::string text = "x h\n\t\xC3\xA9\xF0\x9F\x98\x80";
    const Ids ids = encode(*tok, text);
    EXPECT_EQ(tok->decode(ids), text);
    EXPECT_EQ(tok->token_to_piece(' '), " ");
}

TEST(BpeTokenizerTest, SpecialTokensAreCutOutFirst) {
    Vocab v = byte_level_vocab();
    const int32_t start = add_token(&v, "<|im_start|>", TokenType::kControl);
    const int32_t tool = add_token(&v, "<tool>", TokenType::kUserDefined);
    auto tok = make(v);
    EXPECT_EQ(encode(*tok, "x<|im_start|>y"), (Ids{'x', start, 'y'}));
    // Without parse_special a control token is plain text; a user-defined one is still cut.
    const Ids plain = encode(*tok, "<|im_start|>", /*parse_special=*/false);
    EXPECT_EQ(plain.size(), std::string("<|im_start|>").size());
    EXPECT_EQ(encode(*tok, "a<tool>b", /*parse_special=*/false), (Ids{'a', tool, 'b'}));
    // Control tokens render only when asked; user-defined ones always.
    EXPECT_EQ(tok->decode(Ids{'x', start, tool}), "x<tool>");
    EXPECT_EQ(tok->decode(Ids{'x', start, tool}, /*render_special=*/true), "x<|im_start|><tool>");
}

TEST(BpeTokenizerTest, LongestSpecialTokenWins) {
    Vocab v = byte_level_vocab();
    const int32_t a = add_token(&v, "<a>", TokenType::kControl);
    const int32_t ab = add_token(&v, "<a><b>", TokenType::kControl);
    auto tok = make(v);
    EXPECT_EQ(encode(*tok, "<a><b><a>"), (Ids{ab, a}));
}

TEST(BpeTokenizerTest, AddBosPrependsBos) {
    Vocab v = byte_level_vocab();
    v.bos_id = add_token(&v, "<s>", TokenType::kControl);
    auto tok = make(v);
    auto ids = tok->encode("x", /*add_bos=*/true, true);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, (Ids{v.bos_id, 'x'}));
}

TEST(BpeTokenizerTest, Llama3TakesWholeWordsThatAreTokens) {
    Vocab v = byte_level_vocab();
    const int32_t hello = add_token(&v, "hello");  // no merges lead to it
    v.pre = "llama-bpe";
    EXPECT_EQ(encode(*make(v), "hello"), (Ids{hello}));
    v.pre = "gpt2";
    EXPECT_EQ(encode(*make(v), "hello"), (Ids{'h', 'e', 'l', 'l', 'o'}));
}

TEST(BpeTokenizerTest, ByteTokensDecodeToTheirByte) {
    Vocab v = byte_level_vocab();
    const int32_t byte = add_token(&v, "<0x41>", TokenType::kByte);
    EXPECT_EQ(make(v)->token_to_piece(byte), "A");
}

TEST(BpeTokenizerTest, EndOfGenerationByText) {
    Vocab v = byte_level_vocab();
    const int32_t im_end = add_token(&v, "<|im_end|>", TokenType::kControl);
    v.eos_id = add_token(&v, "</s>", TokenType::kControl);
    auto tok = make(v);
    EXPECT_TRUE(tok->is_eog(im_end));
    EXPECT_TRUE(tok->is_eog(v.eos_id));
    EXPECT_FALSE(tok->is_eog('a'));
}

TEST(BpeTokenizerTest, InvalidUtf8IsRejectedWithItsOffset) {
    auto tok = make(byte_level_vocab());
    auto ids = tok->encode("abc\xFF", false, true);
    ASSERT_FALSE(ids.ok());
    EXPECT_EQ(ids.error().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(ids.error().message().find("offset 3"), std::string::npos);
}

TEST(BpeTokenizerTest, BadVocabulariesAreRejected) {
    Vocab v = byte_level_vocab();
    v.pre = "no-such-pre";
    EXPECT_EQ(make_bpe_tokenizer(v).error().code(), StatusCode::kUnimplemented);
    v = byte_level_vocab();
    v.merges = {"nospace"};
    EXPECT_EQ(make_bpe_tokenizer(v).error().code(), StatusCode::kInvalidArgument);
    v = byte_level_vocab();
    v.types.pop_back();
    EXPECT_EQ(make_bpe_tokenizer(v).error().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(make_bpe_tokenizer(Vocab{}).error().code(), StatusCode::kInvalidArgument);
}

// --- SmolLM2 against llama.cpp ---------------------------------------------------------

class SmolLM2TokenizerTest : public ::testing::Test {
  protected:
    void SetUp() override {
        const std::string model = testing::default_gguf_model();
        DS_REQUIRE_FILE(model, "SmolLM2 GGUF");
        auto tok = load_gguf_tokenizer(model);
        ASSERT_TRUE(tok.ok()) << tok.error().to_string();
        tok_ = std::move(*tok);
    }
    std::unique_ptr<Tokenizer> tok_;
};

nlohmann::json load_golden() {
    std::ifstream in(testing::test_data_dir() + "/smollm2_tokenize.json");
    EXPECT_TRUE(in.good());
    return nlohmann::json::parse(in);
}

TEST_F(SmolLM2TokenizerTest, MatchesLlamaCppIds) {
    const nlohmann::json golden = load_golden();
    ASSERT_GE(golden["entries"].size(), 30u);
    for (const auto& e : golden["entries"]) {
        const std::string text = e["text"];
        const bool parse_special = e["parse_special"];
        auto ids = tok_->encode(text, /*add_bos=*/false, parse_special);
        ASSERT_TRUE(ids.ok()) << ids.error().to_string();
        EXPECT_EQ(*ids, e["ids"].get<Ids>()) << "text: " << text;
        EXPECT_EQ(tok_->decode(*ids), e["decoded"].get<std::string>()) << "text: " << text;
        EXPECT_EQ(tok_->decode(*ids, true), e["decoded_special"].get<std::string>());
        EXPECT_EQ(tok_->decode(*ids, true), text);  // the round trip is exact
    }
}

TEST_F(SmolLM2TokenizerTest, SpecialTokens) {
    EXPECT_EQ(tok_->bos_id(), 1);
    EXPECT_EQ(tok_->eos_id(), 2);
    EXPECT_TRUE(tok_->is_eog(2));  // <|im_end|>
    EXPECT_TRUE(tok_->is_eog(0));  // <|endoftext|>
    EXPECT_FALSE(tok_->is_eog(1));
    EXPECT_EQ(encode(*tok_, "<|im_start|>user\n"), (Ids{1, 4093, 198}));
    EXPECT_EQ(tok_->token_to_piece(2), "");
    EXPECT_EQ(tok_->token_to_piece(2, -1, true), "<|im_end|>");
}

TEST_F(SmolLM2TokenizerTest, EncodesLargeTextQuickly) {
    const nlohmann::json golden = load_golden();
    std::string text;
    while (text.size() < 100 * 1024) {
        for (const auto& e : golden["entries"]) text += e["text"].get<std::string>();
    }
    const auto start = std::chrono::steady_clock::now();
    auto ids = tok_->encode(text, false, true);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ASSERT_TRUE(ids.ok());
    EXPECT_LT(seconds, 1.0) << text.size() << " bytes took " << seconds << " s";
    EXPECT_EQ(tok_->decode(*ids, true), text);
}

}  // namespace
}  // namespace deltaserve::model
