// Code point helpers for the tokenizers (private to model/): UTF-8 decoding and encoding,
// the character classes the pre-tokenizer regexes use (\p{L}, \p{N}, \s), and GPT-2's
// byte <-> code point mapping.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "deltaserve/common/status.h"

namespace deltaserve::model::unicode {

// An inclusive range of code points.
struct CodepointRange {
    uint32_t first;
    uint32_t last;
};

namespace detail {
// Generated tables (unicode_data.cpp): sorted, non-overlapping.
extern const char kUnicodeVersion[];
extern const CodepointRange kLetterRanges[];
extern const size_t kLetterRangesCount;
extern const CodepointRange kNumberRanges[];
extern const size_t kNumberRangesCount;

// NFC tables (unicode_nfc_data.cpp), sorted by code point.
struct CombiningClassRange {
    uint32_t first;
    uint32_t last;
    uint8_t ccc;  // canonical combining class, nonzero
};
struct Decomposition {
    uint32_t cp;
    uint32_t first;
    uint32_t second;  // 0: a singleton
    bool composes;    // a primary composite: first + second compose back to cp
};
extern const CombiningClassRange kCombiningClasses[];
extern const size_t kCombiningClassesCount;
extern const Decomposition kDecompositions[];
extern const size_t kDecompositionsCount;
}  // namespace detail

// The Unicode version the tables were generated from, e.g. "15.1.0".
inline const char* data_version() { return detail::kUnicodeVersion; }

// \p{L}: general category L* (Lu, Ll, Lt, Lm, Lo).
bool is_letter(uint32_t cp);
// \p{N}: general category N* (Nd, Nl, No).
bool is_number(uint32_t cp);
// \s: the White_Space property (PropList.txt): \t-\r, space, U+0085, U+00A0, U+1680,
// U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000.
bool is_whitespace(uint32_t cp);
// Lower case for ASCII letters; other code points are returned unchanged.
inline uint32_t to_lower_ascii(uint32_t cp) { return cp >= 'A' && cp <= 'Z' ? cp + 32 : cp; }

// Length of the UTF-8 sequence a lead byte starts (1 for ASCII, continuation or invalid).
inline size_t utf8_sequence_length(unsigned char lead) {
    static constexpr uint8_t kLengths[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return kLengths[lead >> 4];
}

// Unicode Normalization Form C (canonical decomposition, canonical order, canonical
// composition; the tables' Unicode version), as HF tokenizers' NFC normalizer.
std::vector<uint32_t> nfc(std::span<const uint32_t> cps);

// Decodes UTF-8 into code points. Errors: kInvalidArgument naming the byte offset of the
// first invalid sequence (truncated, overlong, surrogate, past U+10FFFF).
Result<std::vector<uint32_t>> decode_utf8(std::string_view text);

// Appends the UTF-8 encoding of cp (cp must be a valid scalar value).
void append_utf8(uint32_t cp, std::string* out);
std::string encode_utf8(std::span<const uint32_t> cps);

// bytes with every invalid sequence replaced by U+FFFD, one per maximal subpart (the longest
// prefix of a valid sequence, else one byte), as Rust's String::from_utf8_lossy does.
std::string to_valid_utf8(std::string_view bytes);

// GPT-2 byte-level mapping: bytes 0x21-0x7E, 0xA1-0xAC, 0xAE-0xFF map to themselves, the
// other 68 bytes in increasing order to U+0100, U+0101, ... (space -> U+0120 'Ġ').
uint32_t byte_to_codepoint(uint8_t byte);
// The byte a mapped code point stands for, or -1 when cp is not a mapped byte.
int codepoint_to_byte(uint32_t cp);

}  // namespace deltaserve::model::unicode
