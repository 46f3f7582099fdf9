// Byte-level BPE (GGUF tokenizer.ggml.model == "gpt2"), matching llama.cpp's
// llm_tokenizer_bpe_session: special tokens cut out first, the pre-tokenizer splits the text
// into words, each word's bytes are mapped to GPT-2's printable code points and merged by
// rank.
#include <algorithm>
#include <array>
#include <cstdio>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "deltaserve/model/tokenizer.h"
#include "pre_tokenizer.h"
#include "unicode.h"

namespace deltaserve::model {
namespace {

uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
}

class BpeTokenizer final : public Tokenizer {
  public:
    static Result<std::unique_ptr<Tokenizer>> create(Vocab vocab) {
        DS_ASSIGN_OR_RETURN(const PreTokenizerKind pre, pre_tokenizer_from_name(vocab.pre));
        const bool ignore_merges = pre_tokenizer_ignores_merges(vocab.pre);
        fill_default_eog_ids(&vocab);
        std::unique_ptr<BpeTokenizer> tok(new BpeTokenizer(std::move(vocab), pre, ignore_merges));
        DS_RETURN_IF_ERROR(tok->build());
        return std::unique_ptr<Tokenizer>(std::move(tok));
    }

    Result<std::vector<int32_t>> encode_text(
        std::string_view text, bool add_bos, bool parse_special,
        std::span<const std::pair<size_t, size_t>> plain) const override;
    std::string token_to_piece(int32_t id, int32_t prev_id, bool render_special) const override;

  private:
    struct Merge {
        int32_t rank;
        int32_t result;
    };
    struct Symbol {
        int32_t id;  // -1: byte without a token; kDead: merged into its left neighbour
        int32_t prev;
        int32_t next;
    };
    struct Candidate {
        int32_t rank;
        int32_t left;
        int32_t right;
        int32_t left_id;
        int32_t right_id;
        int32_t result;
        // Min-heap on rank, leftmost first among equal ranks.
        bool operator<(const Candidate& o) const {
            return rank != o.rank ? rank > o.rank : left > o.left;
        }
    };
    static constexpr int32_t kDead = -2;

    BpeTokenizer(Vocab vocab, PreTokenizerKind pre, bool ignore_merges)
        : Tokenizer(std::move(vocab)),
          pre_(pre),
          ignore_merges_(ignore_merges),
          specials_(vocab_) {}

    Status build();
    void encode_word(std::string_view bytes, std::vector<Symbol>* symbols,
                     std::vector<Candidate>* heap, std::vector<int32_t>* out) const;
    void push_candidate(const std::vector<Symbol>& symbols, int32_t left,
                        std::vector<Candidate>* heap) const;

    PreTokenizerKind pre_;
    bool ignore_merges_;
    SpecialTokenSplitter specials_;
    std::unordered_map<std::string, int32_t> token_ids_;
    std::unordered_map<uint64_t, Merge> merges_;  // (left id, right id) -> merge
    std::array<int32_t, 256> byte_ids_{};         // token of each byte's mapped code point
    std::vector<std::string> pieces_;             // bytes of each normal token
};

Status BpeTokenizer::build() {
    const size_t n = vocab_.tokens.size();
    if (n == 0) return invalid_argument("BPE vocabulary is empty");
    if (!vocab_.types.empty() && vocab_.types.size() != n) {
        return invalid_argument("BPE vocabulary has " + std::to_string(n) + " tokens but " +
                                std::to_string(vocab_.types.size()) + " token types");
    }
    for (int32_t id : {vocab_.bos_id, vocab_.eos_id, vocab_.unk_id, vocab_.pad_id}) {
        if (id >= static_cast<int32_t>(n)) {
            return invalid_argument("special token id " + std::to_string(id) +
                                    " is outside the vocabulary of " + std::to_string(n));
        }
    }
    token_ids_.reserve(n);
    pieces_.resize(n);
    for (size_t id = 0; id < n; ++id) {
        const std::string& text = vocab_.tokens[id];
        if (!text.empty()) token_ids_.emplace(text, static_cast<int32_t>(id));  // first wins
        if (token_type(vocab_, static_cast<int32_t>(id)) != TokenType::kNormal) continue;
        // Map the printable code points back to bytes; keep anything unmapped as is.
        auto cps = unicode::decode_utf8(text);
        if (!cps.ok()) {
            return invalid_argument("token " + std::to_string(id) + " is not valid UTF-8");
        }
        for (uint32_t cp : *cps) {
            const int byte = unicode::codepoint_to_byte(cp);
            if (byte >= 0) {
                pieces_[id].push_back(static_cast<char>(byte));
            } else {
                unicode::append_utf8(cp, &pieces_[id]);
            }
        }
    }
    for (int b = 0; b < 256; ++b) {
        std::string mapped;
        unicode::append_utf8(unicode::byte_to_codepoint(static_cast<uint8_t>(b)), &mapped);
        auto it = token_ids_.find(mapped);
        byte_ids_[b] = it == token_ids_.end() ? -1 : it->second;
    }
    merges_.reserve(vocab_.merges.size());
    for (size_t rank = 0; rank < vocab_.merges.size(); ++rank) {
        const std::string& merge = vocab_.merges[rank];
        const size_t space = merge.find(' ', 1);
        if (space == std::string::npos) {
            return invalid_argument("BPE merge " + std::to_string(rank) + " ('" + merge +
                                    "') is not 'left right'");
        }
        // A merge whose parts or result are not tokens can never yield a token; skip it.
        auto left = token_ids_.find(merge.substr(0, space));
        auto right = token_ids_.find(merge.substr(space + 1));
        auto result = token_ids_.find(merge.substr(0, space) + merge.substr(space + 1));
        if (left == token_ids_.end() || right == token_ids_.end() || result == token_ids_.end()) {
            continue;
        }
        merges_.emplace(pair_key(left->second, right->second),
                        Merge{static_cast<int32_t>(rank), result->second});
    }
    return {};
}

void BpeTokenizer::push_candidate(const std::vector<Symbol>& symbols, int32_t left,
                                  std::vector<Candidate>* heap) const {
    if (left < 0) return;
    const int32_t right = symbols[left].next;
    if (right < 0 || symbols[left].id < 0 || symbols[right].id < 0) return;
    auto it = merges_.find(pair_key(symbols[left].id, symbols[right].id));
    if (it == merges_.end()) return;
    heap->push_back(
        {it->second.rank, left, right, symbols[left].id, symbols[right].id, it->second.result});
    std::push_heap(heap->begin(), heap->end());
}

void BpeTokenizer::encode_word(std::string_view bytes, std::vector<Symbol>* symbols,
                               std::vector<Candidate>* heap, std::vector<int32_t>* out) const {
    if (bytes.size() == 1) {
        const int32_t id = byte_ids_[static_cast<uint8_t>(bytes[0])];
        if (id >= 0) out->push_back(id);
        return;
    }
    if (ignore_merges_) {  // llama3: a word that is a token is taken whole
        std::string mapped;
        for (char c : bytes) {
            unicode::append_utf8(unicode::byte_to_codepoint(static_cast<uint8_t>(c)), &mapped);
        }
        auto it = token_ids_.find(mapped);
        if (it != token_ids_.end()) {
            out->push_back(it->second);
            return;
        }
    }
    const auto n = static_cast<int32_t>(bytes.size());
    symbols->resize(n);
    for (int32_t i = 0; i < n; ++i) {
        (*symbols)[i] = {byte_ids_[static_cast<uint8_t>(bytes[i])], i - 1, i + 1 < n ? i + 1 : -1};
    }
    heap->clear();
    for (int32_t i = 0; i + 1 < n; ++i) push_candidate(*symbols, i, heap);
    while (!heap->empty()) {
        std::pop_heap(heap->begin(), heap->end());
        const Candidate c = heap->back();
        heap->pop_back();
        Symbol& left = (*symbols)[c.left];
        Symbol& right = (*symbols)[c.right];
        // Stale: one side has merged since the candidate was queued.
        if (left.id != c.left_id || right.id != c.right_id || left.next != c.right) continue;
        left.id = c.result;
        left.next = right.next;
        if (right.next >= 0) (*symbols)[right.next].prev = c.left;
        right.id = kDead;
        push_candidate(*symbols, left.prev, heap);
        push_candidate(*symbols, c.left, heap);
    }
    // Bytes without a token are dropped, as llama.cpp does.
    for (int32_t i = 0; i >= 0; i = (*symbols)[i].next) {
        if ((*symbols)[i].id >= 0) out->push_back((*symbols)[i].id);
    }
}

Result<std::vector<int32_t>> BpeTokenizer::encode_text(
    std::string_view text, bool add_bos, bool parse_special,
    std::span<const std::pair<size_t, size_t>> plain) const {
    const int64_t bad = find_invalid_utf8(text);
    if (bad >= 0) return invalid_argument("invalid UTF-8 at byte offset " + std::to_string(bad));
    std::vector<int32_t> out;
    if (add_bos && vocab_.bos_id >= 0) out.push_back(vocab_.bos_id);
    std::vector<Symbol> symbols;
    std::vector<Candidate> heap;
    for (const TextFragment& f : specials_.split(text, parse_special, plain)) {
        if (f.token >= 0) {
            out.push_back(f.token);
            continue;
        }
        std::string_view fragment = text.substr(f.offset, f.length);
        DS_ASSIGN_OR_RETURN(std::vector<uint32_t> cps, unicode::decode_utf8(fragment));
        std::string normalized;  // HF normalizes what is left between the special tokens
        if (vocab_.nfc) {
            std::vector<uint32_t> composed = unicode::nfc(cps);
            if (composed != cps) {
                normalized = unicode::encode_utf8(composed);
                fragment = normalized;
                cps = std::move(composed);
            }
        }
        size_t byte = 0;
        for (size_t word_len : pre_tokenize(pre_, cps)) {
            const size_t begin = byte;
            for (size_t k = 0; k < word_len; ++k) {
                byte += unicode::utf8_sequence_length(static_cast<unsigned char>(fragment[byte]));
            }
            encode_word(fragment.substr(begin, byte - begin), &symbols, &heap, &out);
        }
    }
    return out;
}

std::string BpeTokenizer::token_to_piece(int32_t id, int32_t /*prev_id*/,
                                         bool render_special) const {
    if (id < 0 || id >= vocab_size()) return {};
    switch (token_type(vocab_, id)) {
        case TokenType::kNormal:
            return pieces_[id];
        case TokenType::kControl:
        case TokenType::kUnknown:
            return render_special ? vocab_.tokens[id] : std::string();
        case TokenType::kUserDefined:
            return vocab_.tokens[id];
        case TokenType::kByte: {
            const int byte = parse_byte_token(vocab_.tokens[id]);
            return byte >= 0 ? std::string(1, static_cast<char>(byte)) : std::string();
        }
        default:
            return {};
    }
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> make_bpe_tokenizer(Vocab vocab) {
    return BpeTokenizer::create(std::move(vocab));
}

}  // namespace deltaserve::model
