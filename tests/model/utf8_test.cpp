// UTF-8 validation and the code point helpers behind the pre-tokenizers.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "../../model/src/pre_tokenizer.h"
#include "../../model/src/unicode.h"
#include "deltaserve/model/tokenizer.h"

namespace deltaserve::model {
namespace {

TEST(Utf8Test, FindInvalidAcceptsValidText) {
    EXPECT_EQ(find_invalid_utf8(""), -1);
    EXPECT_EQ(find_invalid_utf8("plain ascii\n\t"), -1);
    EXPECT_EQ(find_invalid_utf8("caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x98\x80"), -1);
    EXPECT_EQ(find_invalid_utf8("\xF4\x8F\xBF\xBF"), -1);  // U+10FFFF
}

TEST(Utf8Test, FindInvalidNamesTheOffset) {
    EXPECT_EQ(find_invalid_utf8("ab\x80"), 2);   // stray continuation byte
    EXPECT_EQ(find_invalid_utf8("abc\xC3"), 3);  // truncated at the end
    EXPECT_EQ(find_invalid_utf8("a\xE4\xBD"
                                "b"),
              1);                                         // truncated in the middle
    EXPECT_EQ(find_invalid_utf8("xy\xC0\x80"), 2);        // overlong NUL
    EXPECT_EQ(find_invalid_utf8("\xE0\x80\xAF"), 0);      // overlong '/'
    EXPECT_EQ(find_invalid_utf8("ok\xED\xA0\x80"), 2);    // surrogate U+D800
    EXPECT_EQ(find_invalid_utf8("\xF4\x90\x80\x80"), 0);  // past U+10FFFF
    EXPECT_EQ(find_invalid_utf8("\xC3\xA9\xFF"), 2);      // never valid
}

TEST(Utf8Test, DecodeEncodeRoundTrip) {
    const std::string text = "a\xC3\xA9\xE4\xBD\xA0\xF0\x9F\x98\x80";
    auto cps = unicode::decode_utf8(text);
    ASSERT_TRUE(cps.ok());
    EXPECT_EQ(*cps, (std::vector<uint32_t>{'a', 0xE9, 0x4F60, 0x1F600}));
    EXPECT_EQ(unicode::encode_utf8(*cps), text);
}

TEST(Utf8Test, DecodeErrorNamesTheOffset) {
    auto cps = unicode::decode_utf8("hello \xE4\xBD");
    ASSERT_FALSE(cps.ok());
    EXPECT_EQ(cps.error().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(cps.error().message().find("offset 6"), std::string::npos) << cps.error().message();
}

// As Python's and Rust's lossy decoders (HF's decode): one U+FFFD per maximal subpart.
TEST(Utf8Test, ToValidReplacesMaximalSubparts) {
    const std::string r = "\xEF\xBF\xBD";
    EXPECT_EQ(unicode::to_valid_utf8("caf\xC3\xA9"), "caf\xC3\xA9");
    EXPECT_EQ(unicode::to_valid_utf8("a\xF1\x80\x80"
                                     "b"),
              "a" + r + "b");                                              // truncated 4-byte
    EXPECT_EQ(unicode::to_valid_utf8("\xC0\x80"), r + r);                  // overlong
    EXPECT_EQ(unicode::to_valid_utf8("\xED\xA0\x80"), r + r + r);          // surrogate
    EXPECT_EQ(unicode::to_valid_utf8("\xE0\x80\xAF"), r + r + r);          // overlong '/'
    EXPECT_EQ(unicode::to_valid_utf8("\xF4\x90\x80\x80"), r + r + r + r);  // past U+10FFFF
    EXPECT_EQ(unicode::to_valid_utf8("x\xE2\x82"), "x" + r);               // truncated at the end
    EXPECT_EQ(unicode::to_valid_utf8("\xF0\x9F\x98"), r);
}

std::vector<uint32_t> nfc(std::vector<uint32_t> cps) { return unicode::nfc(cps); }

// Against Python's unicodedata2 15.1 normalize("NFC", ...).
TEST(Utf8Test, Nfc) {
    using Cps = std::vector<uint32_t>;
    EXPECT_EQ(nfc({'e', 0x301}), (Cps{0xE9}));
    EXPECT_EQ(nfc({0x212B}), (Cps{0xC5}));                    // singleton: Angstrom sign
    EXPECT_EQ(nfc({0x1112, 0x1161, 0x11AB}), (Cps{0xD55C}));  // conjoining jamo
    EXPECT_EQ(nfc({0xAC00, 0x11A8}), (Cps{0xAC01}));          // LV + T
    EXPECT_EQ(nfc({0x1100, 0x1161, 0x11A8, 0x301}), (Cps{0xAC01, 0x301}));
    EXPECT_EQ(nfc({'a', 0x323, 0x302}), (Cps{0x1EAD}));  // marks in either order
    EXPECT_EQ(nfc({'a', 0x302, 0x323}), (Cps{0x1EAD}));
    EXPECT_EQ(nfc({'A', 0x30A, 0x301}), (Cps{0x1FA}));              // composes twice
    EXPECT_EQ(nfc({'q', 0x307, 0x323}), (Cps{'q', 0x323, 0x307}));  // reordered, no composite
    EXPECT_EQ(nfc({0x958}), (Cps{0x915, 0x93C}));                   // composition exclusion
    EXPECT_EQ(nfc({0x344}), (Cps{0x308, 0x301}));                   // non-starter decomposition
    EXPECT_EQ(nfc({0xF73}), (Cps{0xF71, 0xF72}));
    EXPECT_EQ(nfc({'a', 0x305, 0x301}), (Cps{'a', 0x305, 0x301}));  // blocked (same class)
    EXPECT_EQ(nfc({'a', 'b', 0x7F}), (Cps{'a', 'b', 0x7F}));
}

TEST(Utf8Test, CharacterClasses) {
    EXPECT_TRUE(unicode::is_letter('a'));
    EXPECT_TRUE(unicode::is_letter(0xE9));    // é
    EXPECT_TRUE(unicode::is_letter(0x4F60));  // 你
    EXPECT_TRUE(unicode::is_letter(0x0416));  // Ж
    EXPECT_FALSE(unicode::is_letter('1'));
    EXPECT_FALSE(unicode::is_letter(0x1F600));  // 😀 is a symbol
    EXPECT_FALSE(unicode::is_letter(0x0301));   // combining acute is a mark
    EXPECT_TRUE(unicode::is_number('7'));
    EXPECT_TRUE(unicode::is_number(0x00B2));  // ²
    EXPECT_TRUE(unicode::is_number(0x0663));  // Arabic-Indic three
    EXPECT_TRUE(unicode::is_number(0x216B));  // Ⅻ (Nl)
    EXPECT_FALSE(unicode::is_number('x'));
    for (uint32_t cp : {0x09u, 0x0Au, 0x0Du, 0x20u, 0x85u, 0xA0u, 0x2003u, 0x3000u}) {
        EXPECT_TRUE(unicode::is_whitespace(cp)) << cp;
    }
    EXPECT_FALSE(unicode::is_whitespace(0x200B));  // zero width space is not White_Space
    EXPECT_FALSE(unicode::is_whitespace(0x1F));
}

TEST(Utf8Test, TablesAreUnicode15LikeLlamaCpp) {
    EXPECT_STREQ(unicode::data_version(), "15.1.0");
    EXPECT_TRUE(unicode::is_letter(0x1E4D0));   // Nag Mundari, new in 15.0
    EXPECT_FALSE(unicode::is_letter(0x10D4A));  // Garay, new in 16.0: unassigned here
}

TEST(Utf8Test, ByteMappingIsGpt2s) {
    EXPECT_EQ(unicode::byte_to_codepoint(' '), 0x120u);   // Ġ
    EXPECT_EQ(unicode::byte_to_codepoint('\n'), 0x10Au);  // Ċ
    EXPECT_EQ(unicode::byte_to_codepoint('A'), uint32_t{'A'});
    EXPECT_EQ(unicode::byte_to_codepoint(0xAD), 0x143u);  // the last unprintable byte
    std::set<uint32_t> seen;
    for (int b = 0; b < 256; ++b) {
        const uint32_t cp = unicode::byte_to_codepoint(static_cast<uint8_t>(b));
        EXPECT_TRUE(seen.insert(cp).second);
        EXPECT_EQ(unicode::codepoint_to_byte(cp), b);
    }
    EXPECT_EQ(unicode::codepoint_to_byte(0x4F60), -1);
}

// Splits text with a pre-tokenizer and returns the words.
std::vector<std::string> words(PreTokenizerKind kind, const std::string& text) {
    auto cps = unicode::decode_utf8(text);
    EXPECT_TRUE(cps.ok());
    std::vector<std::string> out;
    size_t start = 0;
    for (size_t len : pre_tokenize(kind, *cps)) {
        out.push_back(unicode::encode_utf8(std::span(*cps).subspan(start, len)));
        start += len;
    }
    EXPECT_EQ(start, cps->size());
    return out;
}

using Words = std::vector<std::string>;

TEST(PreTokenizerTest, Gpt2) {
    EXPECT_EQ(words(PreTokenizerKind::kGpt2, "Hello world, it's 2024!"),
              (Words{"Hello", " world", ",", " it", "'s", " 2024", "!"}));
    EXPECT_EQ(words(PreTokenizerKind::kGpt2, "a   b  "), (Words{"a", "  ", " b", "  "}));
    EXPECT_EQ(words(PreTokenizerKind::kGpt2, "x\n\n y"), (Words{"x", "\n\n", " y"}));
    EXPECT_EQ(words(PreTokenizerKind::kGpt2, "DON'T"), (Words{"DON", "'", "T"}));
}

TEST(PreTokenizerTest, SmolLMSplitsEveryDigit) {
    EXPECT_EQ(words(PreTokenizerKind::kSmolLM, " 123"), (Words{" ", "1", "2", "3"}));
    EXPECT_EQ(words(PreTokenizerKind::kSmolLM, "ab12 c"), (Words{"ab", "1", "2", " c"}));
}

TEST(PreTokenizerTest, Llama3) {
    EXPECT_EQ(words(PreTokenizerKind::kLlama3, "1234567"), (Words{"123", "456", "7"}));
    EXPECT_EQ(words(PreTokenizerKind::kLlama3, "DON'T stop"), (Words{"DON", "'T", " stop"}));
    EXPECT_EQ(words(PreTokenizerKind::kLlama3, "(hi)\n\n  x"), (Words{"(hi", ")\n\n", " ", " x"}));
    EXPECT_EQ(words(PreTokenizerKind::kLlama3, "a \n b"), (Words{"a", " \n", " b"}));
}

TEST(PreTokenizerTest, Qwen2SplitsSingleDigits) {
    EXPECT_EQ(words(PreTokenizerKind::kQwen2, "x 123"), (Words{"x", " ", "1", "2", "3"}));
}

TEST(PreTokenizerTest, Names) {
    EXPECT_EQ(*pre_tokenizer_from_name("smollm"), PreTokenizerKind::kSmolLM);
    EXPECT_EQ(*pre_tokenizer_from_name("llama-bpe"), PreTokenizerKind::kLlama3);
    EXPECT_EQ(*pre_tokenizer_from_name("gpt2"), PreTokenizerKind::kGpt2);
    EXPECT_EQ(*pre_tokenizer_from_name("qwen2"), PreTokenizerKind::kQwen2);
    auto unknown = pre_tokenizer_from_name("tekken");
    ASSERT_FALSE(unknown.ok());
    EXPECT_EQ(unknown.error().code(), StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace deltaserve::model
