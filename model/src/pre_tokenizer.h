// Text splitting shared by the tokenizers (private to model/): cutting special tokens out
// of the raw text, and the byte-level BPE pre-tokenizers (the regex splits of llama.cpp,
// implemented by hand over code points).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "deltaserve/common/status.h"
#include "deltaserve/model/tokenizer.h"

namespace deltaserve::model {

// The pre-tokenizer regex lists deltaserve implements (llama.cpp's LLAMA_VOCAB_PRE_TYPE_*).
enum class PreTokenizerKind {
    kGpt2,    // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
    kSmolLM,  // \p{N} (every digit alone), then kGpt2 (also starcoder, refact, ...)
    kLlama3,  // (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|...
    kQwen2,   // as kLlama3 with \p{N} (single digits)
};

// Maps a tokenizer.ggml.pre name ("gpt2", "smollm", "llama-bpe", "qwen2", and the names
// llama.cpp treats the same way) to its kind. Errors: kUnimplemented for other names.
Result<PreTokenizerKind> pre_tokenizer_from_name(std::string_view pre);

// True for the pre-tokenizers whose words are looked up whole before merging (llama3).
bool pre_tokenizer_ignores_merges(std::string_view pre);

// Splits cps into words; returns the length (in code points) of each word, in order.
std::vector<size_t> pre_tokenize(PreTokenizerKind kind, std::span<const uint32_t> cps);

// A piece of the input after special tokens are cut out: a token, or a span of raw text.
struct TextFragment {
    int32_t token = -1;  // >= 0: a special token
    size_t offset = 0;   // raw text: byte range in the input
    size_t length = 0;
};

// Cuts special tokens out of text the way llama.cpp does: every control, user-defined and
// unknown token, longest text first; control and unknown ones only with parse_special.
class SpecialTokenSplitter {
  public:
    explicit SpecialTokenSplitter(const Vocab& vocab);

    // No control or unknown token is cut from a match that overlaps `plain` (sorted,
    // disjoint byte ranges of text: a chat prompt's user text).
    std::vector<TextFragment> split(std::string_view text, bool parse_special,
                                    std::span<const std::pair<size_t, size_t>> plain = {}) const;

  private:
    struct Special {
        int32_t id;
        std::string text;
        bool always;  // user-defined: split even without parse_special
    };
    std::vector<Special> specials_;  // longest text first
};

// The type of token id (kNormal when the vocabulary stores no types).
inline TokenType token_type(const Vocab& vocab, int32_t id) {
    if (id < 0 || static_cast<size_t>(id) >= vocab.types.size()) return TokenType::kNormal;
    return vocab.types[id];
}

// Fills vocab->eog_ids when empty: eos plus, by text, the end-of-turn tokens llama.cpp
// recognises (<|im_end|>, <|eot_id|>, <|endoftext|>, ...).
void fill_default_eog_ids(Vocab* vocab);

// "<0xAB>" -> 0xAB; -1 when text is not a byte-fallback token.
int parse_byte_token(const std::string& text);

}  // namespace deltaserve::model
