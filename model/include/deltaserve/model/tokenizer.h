// Tokenizers: byte-level BPE (GPT-2 style; GGUF "gpt2" and HF tokenizer.json) and
// SentencePiece-style vocabularies (GGUF "llama", llama2.c tokenizer.bin).
//
// A Tokenizer is immutable after construction and safe to use from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "deltaserve/common/status.h"

namespace deltaserve::model {

// GGUF tokenizer.ggml.token_type values.
enum class TokenType : int32_t {
    kUndefined = 0,
    kNormal = 1,
    kUnknown = 2,
    kControl = 3,
    kUserDefined = 4,
    kUnused = 5,
    kByte = 6,
};

// The vocabulary as the model file stores it; every tokenizer kind is built from one.
struct Vocab {
    std::vector<std::string> tokens;  // BPE: byte-mapped text ("Ġhello"); SPM: "▁hello"
    std::vector<float> scores;        // SPM merge scores; may be empty for BPE
    std::vector<TokenType> types;     // empty means all kNormal
    // "left right", rank = index. BPE; SPM from a tokenizer.json (HF's BPE with byte
    // fallback): merges of two tokens, lowest rank first, replace the scores.
    std::vector<std::string> merges;
    std::string pre = "gpt2";  // BPE pre-tokenizer: gpt2, smollm, llama3, qwen2, ...
    int32_t bos_id = -1;
    int32_t eos_id = -1;
    int32_t unk_id = -1;
    int32_t pad_id = -1;
    bool add_bos = false;
    bool add_space_prefix = true;  // SPM only
    // SPM only: merges ranked by token id (lower first) instead of score, and only of two
    // tokens, as Hugging Face's Gemma tokenizers rank them (their scores do not follow the
    // merge order). Default: false (llama.cpp's score order); the GGUF loader sets it for
    // the gemma architectures.
    bool merges_by_position = false;
    // BPE only: the text is NFC-normalized before it is split (Qwen2's tokenizer.json).
    // Default: false; set for the qwen2 pre-tokenizer and a tokenizer.json's NFC normalizer.
    bool nfc = false;
    std::vector<int32_t> eog_ids;  // end-of-generation ids (eos plus e.g. <|im_end|>)
};

class Tokenizer {
  public:
    virtual ~Tokenizer() = default;

    // Text -> ids. add_bos: prepend BOS when the vocabulary has one. parse_special: cut
    // control / user-defined tokens written in the text (e.g. "<|im_start|>") out as
    // single ids; otherwise they are tokenized as plain text.
    // Errors: kInvalidArgument when text is not valid UTF-8 (naming the byte offset).
    Result<std::vector<int32_t>> encode(std::string_view text, bool add_bos,
                                        bool parse_special) const {
        return encode_text(text, add_bos, parse_special, {});
    }

    // A rendered chat prompt: control tokens are cut out of the template's text but never
    // out of the byte ranges `plain` (sorted, disjoint: the messages' and tools' text), so
    // a user who writes "<|im_start|>" gets those characters. Everything else is tokenized
    // as one text, as Hugging Face tokenizes the whole prompt.
    Result<std::vector<int32_t>> encode_prompt(
        std::string_view text, bool add_bos,
        std::span<const std::pair<size_t, size_t>> plain) const {
        return encode_text(text, add_bos, true, plain);
    }

    // The bytes token `id` contributes to the output when it follows `prev_id` (-1 at the
    // start). Control tokens render as "" unless render_special. Pieces may be partial
    // UTF-8 sequences; concatenating the pieces of a sequence gives its text.
    virtual std::string token_to_piece(int32_t id, int32_t prev_id = -1,
                                       bool render_special = false) const = 0;

    // The text of ids, as Hugging Face tokenizers decode it: the pieces concatenated, then
    // made valid UTF-8 (each invalid sequence one U+FFFD; a run of byte-fallback tokens that
    // is not valid UTF-8 as a whole one U+FFFD per byte). Streaming wants token_to_piece.
    std::string decode(std::span<const int32_t> ids, bool render_special = false) const;

    const Vocab& vocab() const { return vocab_; }
    int32_t vocab_size() const { return static_cast<int32_t>(vocab_.tokens.size()); }
    int32_t bos_id() const { return vocab_.bos_id; }
    int32_t eos_id() const { return vocab_.eos_id; }
    bool is_eog(int32_t id) const;

  protected:
    explicit Tokenizer(Vocab vocab) : vocab_(std::move(vocab)) {}
    // encode and encode_prompt: no control token is cut from inside `plain`.
    virtual Result<std::vector<int32_t>> encode_text(
        std::string_view text, bool add_bos, bool parse_special,
        std::span<const std::pair<size_t, size_t>> plain) const = 0;
    Vocab vocab_;
};

// Byte-level BPE from a vocabulary with merges (GGUF tokenizer.ggml.model == "gpt2").
Result<std::unique_ptr<Tokenizer>> make_bpe_tokenizer(Vocab vocab);

// SentencePiece-style (GGUF tokenizer.ggml.model == "llama"): highest-score merges,
// "▁" for spaces, <0xXX> byte fallback.
Result<std::unique_ptr<Tokenizer>> make_spm_tokenizer(Vocab vocab);

// llama2.c tokenizer.bin with vocab_size entries (the count comes from the model header).
Result<std::unique_ptr<Tokenizer>> load_llama2c_tokenizer(const std::string& path,
                                                          int32_t vocab_size);

// Hugging Face tokenizer.json (BPE models with a ByteLevel pre-tokenizer), plus
// tokenizer_config.json beside it when present (bos/eos, add_bos, chat template).
Result<std::unique_ptr<Tokenizer>> load_hf_tokenizer(const std::string& tokenizer_json_path);

// Returns the byte offset of the first invalid UTF-8 sequence, or -1 if text is valid.
int64_t find_invalid_utf8(std::string_view text);

}  // namespace deltaserve::model
