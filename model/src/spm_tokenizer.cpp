// SentencePiece-style tokenizers: GGUF "llama" vocabularies (llama.cpp's llm_tokenizer_spm)
// and llama2.c's tokenizer.bin (run.c's encode / decode).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "deltaserve/model/tokenizer.h"
#include "pre_tokenizer.h"
#include "unicode.h"

namespace deltaserve::model {
namespace {

constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";  // U+2581 '▁'

struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenIndex = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

TokenIndex index_tokens(const std::vector<std::string>& tokens) {
    TokenIndex index;
    index.reserve(tokens.size());
    for (size_t id = 0; id < tokens.size(); ++id) {
        index.emplace(tokens[id], static_cast<int32_t>(id));  // first wins
    }
    return index;
}

int32_t find_token(const TokenIndex& index, std::string_view text) {
    auto it = index.find(text);
    return it == index.end() ? -1 : it->second;
}

uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
}

// What a pair of symbols would merge into: a token (-1: none) and the merge's score.
struct PairMerge {
    int32_t result = -1;
    float score = 0.0f;
};

// Greedy highest-score merging, shared by both tokenizers: while some adjacent pair of
// symbols joins into a token, merge the pair that scores highest (ties: leftmost).
// ids[i] is symbol i's token (-1: none). lookup(left, right) returns the PairMerge of the
// pair; pairs scoring min_score or less never merge. on_merge(left, right) lets the caller
// update its own per-symbol state. Returns the surviving symbols' indices, in order.
template <typename LookupFn, typename MergeFn>
std::vector<int32_t> merge_by_score(std::vector<int32_t>* ids, float min_score, LookupFn lookup,
                                    MergeFn on_merge) {
    struct Candidate {
        float score;
        int32_t left, right, left_id, right_id, result;
        bool operator<(const Candidate& o) const {  // max-heap: best score, then leftmost
            return score != o.score ? score < o.score : left > o.left;
        }
    };
    constexpr int32_t kDead = -2;
    const auto n = static_cast<int32_t>(ids->size());
    std::vector<int32_t> next(n), prev(n);
    for (int32_t i = 0; i < n; ++i) {
        prev[i] = i - 1;
        next[i] = i + 1 < n ? i + 1 : -1;
    }
    std::vector<Candidate> heap;
    auto push = [&](int32_t left) {
        if (left < 0 || next[left] < 0) return;
        const int32_t right = next[left];
        const PairMerge m = lookup(left, right);
        if (m.result < 0 || !(m.score > min_score)) return;
        heap.push_back({m.score, left, right, (*ids)[left], (*ids)[right], m.result});
        std::push_heap(heap.begin(), heap.end());
    };
    for (int32_t i = 0; i + 1 < n; ++i) push(i);
    while (!heap.empty()) {
        std::pop_heap(heap.begin(), heap.end());
        const Candidate c = heap.back();
        heap.pop_back();
        if ((*ids)[c.left] != c.left_id || (*ids)[c.right] != c.right_id ||
            next[c.left] != c.right) {
            continue;  // stale: one side merged since the candidate was queued
        }
        on_merge(c.left, c.right);
        (*ids)[c.left] = c.result;
        (*ids)[c.right] = kDead;
        next[c.left] = next[c.right];
        if (next[c.right] >= 0) prev[next[c.right]] = c.left;
        push(prev[c.left]);
        push(c.left);
    }
    std::vector<int32_t> alive;
    for (int32_t i = n > 0 ? 0 : -1; i >= 0; i = next[i]) alive.push_back(i);
    return alive;
}

// ---------------------------------------------------------------------------------------
// GGUF "llama" vocabularies.

// llama.cpp's Gemma conversion writes the tokens of 2-31 "▁" as spaces, user-defined; HF's
// GGUF converter (transformers' gemma_tokenizer) spells them "▁" again, so they are merged
// like other tokens rather than cut out of the text. A token made only of spaces is the run
// of "▁" it stands for.
void respell_space_runs(Vocab* vocab) {
    for (size_t id = 0; id < vocab->tokens.size(); ++id) {
        std::string& text = vocab->tokens[id];
        if (text.empty() || text.find_first_not_of(' ') != std::string::npos) continue;
        const size_t n = text.size();
        text.clear();
        for (size_t i = 0; i < n; ++i) text += kSpaceMarker;
        if (!vocab->types.empty()) vocab->types[id] = TokenType::kNormal;
    }
}

// Merge priority of each token: its score, or minus its id (merges_by_position).
std::vector<float> merge_priorities(const Vocab& vocab) {
    if (!vocab.merges_by_position) return vocab.scores;
    std::vector<float> priority(vocab.tokens.size());
    for (size_t id = 0; id < priority.size(); ++id) priority[id] = -static_cast<float>(id);
    return priority;
}

class SpmTokenizer final : public Tokenizer {
  public:
    explicit SpmTokenizer(Vocab vocab)
        : Tokenizer(std::move(vocab)),
          specials_(vocab_),
          index_(index_tokens(vocab_.tokens)),
          priorities_(merge_priorities(vocab_)) {
        for (size_t rank = 0; rank < vocab_.merges.size(); ++rank) {
            const std::string& merge = vocab_.merges[rank];
            const size_t space = merge.find(' ', 1);
            if (space == std::string::npos) continue;
            const int32_t left = find_token(index_, std::string_view(merge).substr(0, space));
            const int32_t right = find_token(index_, std::string_view(merge).substr(space + 1));
            const int32_t result =
                find_token(index_, merge.substr(0, space) + merge.substr(space + 1));
            if (left < 0 || right < 0 || result < 0) continue;
            ranked_.emplace(pair_key(left, right), RankedMerge{static_cast<int32_t>(rank), result});
        }
        for (int b = 0; b < 256; ++b) {
            char hex[8];
            std::snprintf(hex, sizeof(hex), "<0x%02X>", b);
            byte_ids_[b] = find_token(index_, hex);
            if (byte_ids_[b] < 0) byte_ids_[b] = find_token(index_, std::string(1, char(b)));
            if (byte_ids_[b] < 0) byte_ids_[b] = vocab_.unk_id;
        }
    }

    Result<std::vector<int32_t>> encode_text(
        std::string_view text, bool add_bos, bool parse_special,
        std::span<const std::pair<size_t, size_t>> plain) const override {
        const int64_t bad = find_invalid_utf8(text);
        if (bad >= 0) {
            return invalid_argument("invalid UTF-8 at byte offset " + std::to_string(bad));
        }
        std::vector<int32_t> out;
        if (add_bos && vocab_.bos_id >= 0) out.push_back(vocab_.bos_id);
        bool prev_special = true;  // the text's start counts as after a special token
        for (const TextFragment& f : specials_.split(text, parse_special, plain)) {
            if (f.token >= 0) {
                out.push_back(f.token);
                prev_special = true;
                continue;
            }
            std::string escaped;
            if (vocab_.add_space_prefix && prev_special) escaped = kSpaceMarker;
            for (char c : text.substr(f.offset, f.length)) {
                if (c == ' ') {
                    escaped += kSpaceMarker;
                } else {
                    escaped += c;
                }
            }
            encode_escaped(escaped, &out);
            prev_special = false;
        }
        return out;
    }

    std::string token_to_piece(int32_t id, int32_t prev_id, bool render_special) const override {
        if (id < 0 || id >= vocab_size()) return {};
        const std::string& text = vocab_.tokens[id];
        switch (token_type(vocab_, id)) {
            case TokenType::kControl:
            case TokenType::kUnknown:
                return render_special ? text : std::string();
            case TokenType::kUserDefined:
                return text;
            case TokenType::kByte: {
                const int byte = parse_byte_token(text);
                return byte >= 0 ? std::string(1, static_cast<char>(byte)) : std::string();
            }
            case TokenType::kNormal: {
                std::string piece;
                for (size_t i = 0; i < text.size();) {
                    if (text.compare(i, kSpaceMarker.size(), kSpaceMarker) == 0) {
                        piece += ' ';
                        i += kSpaceMarker.size();
                    } else {
                        piece += text[i++];
                    }
                }
                // SentencePiece drops the dummy-prefix space at the start of the text.
                const bool at_start = prev_id < 0 || prev_id == vocab_.bos_id;
                if (vocab_.add_space_prefix && at_start && !piece.empty() && piece[0] == ' ') {
                    piece.erase(0, 1);
                }
                return piece;
            }
            default:
                return {};
        }
    }

  private:
    void encode_escaped(const std::string& text, std::vector<int32_t>* out) const {
        // One symbol per UTF-8 character, each a span of text; a merged symbol is the union
        // of two adjacent spans, looked up by its text (as llama.cpp does).
        std::vector<size_t> begin, length;
        std::vector<int32_t> ids;
        for (size_t i = 0; i < text.size();) {
            const size_t len = std::min(unicode::utf8_sequence_length(text[i]), text.size() - i);
            begin.push_back(i);
            length.push_back(len);
            ids.push_back(find_token(index_, std::string_view(text).substr(i, len)));
            i += len;
        }
        auto lookup = [&](int32_t l, int32_t r) -> PairMerge {
            if (!ranked_.empty()) {  // a tokenizer.json's merges: the lowest rank first
                if (ids[l] < 0 || ids[r] < 0) return {};
                auto it = ranked_.find(pair_key(ids[l], ids[r]));
                if (it == ranked_.end()) return {};
                return {it->second.result, -static_cast<float>(it->second.rank)};
            }
            // HF merges two tokens only; llama.cpp any two spans whose text is a token.
            if (vocab_.merges_by_position && (ids[l] < 0 || ids[r] < 0)) return {};
            const int32_t result =
                find_token(index_, std::string_view(text).substr(begin[l], length[l] + length[r]));
            if (result < 0) return {};
            return {result,
                    static_cast<size_t>(result) < priorities_.size() ? priorities_[result] : 0.0f};
        };
        auto on_merge = [&](int32_t l, int32_t r) { length[l] += length[r]; };
        for (int32_t i :
             merge_by_score(&ids, -std::numeric_limits<float>::infinity(), lookup, on_merge)) {
            if (ids[i] >= 0) {
                out->push_back(ids[i]);
                continue;
            }
            for (char c : std::string_view(text).substr(begin[i], length[i])) {
                const int32_t byte_id = byte_ids_[static_cast<uint8_t>(c)];
                if (byte_id >= 0) out->push_back(byte_id);
            }
        }
    }

    struct RankedMerge {
        int32_t rank;
        int32_t result;
    };

    SpecialTokenSplitter specials_;
    TokenIndex index_;
    std::vector<float> priorities_;                     // per token: higher merges first
    std::unordered_map<uint64_t, RankedMerge> ranked_;  // (left, right) -> merge; may be empty
    int32_t byte_ids_[256];
};

// ---------------------------------------------------------------------------------------
// llama2.c tokenizer.bin.

class Llama2cTokenizer final : public Tokenizer {
  public:
    explicit Llama2cTokenizer(Vocab vocab)
        : Tokenizer(std::move(vocab)), index_(index_tokens(vocab_.tokens)) {}

    Result<std::vector<int32_t>> encode_text(
        std::string_view text, bool add_bos, bool /*parse_special*/,
        std::span<const std::pair<size_t, size_t>> /*plain*/) const override {
        const int64_t bad = find_invalid_utf8(text);
        if (bad >= 0) {
            return invalid_argument("invalid UTF-8 at byte offset " + std::to_string(bad));
        }
        std::vector<int32_t> ids;
        if (add_bos) ids.push_back(vocab_.bos_id);
        if (!text.empty()) {
            const int32_t dummy_prefix = find_token(index_, " ");
            if (dummy_prefix >= 0) ids.push_back(dummy_prefix);
        }
        for (size_t i = 0; i < text.size();) {
            const size_t len = unicode::utf8_sequence_length(text[i]);
            const int32_t id = find_token(index_, text.substr(i, len));
            if (id >= 0) {
                ids.push_back(id);
            } else {
                for (size_t k = 0; k < len; ++k) {  // byte fallback: <0xXX> is id byte + 3
                    const int32_t byte_id = static_cast<uint8_t>(text[i + k]) + 3;
                    if (byte_id < vocab_size()) ids.push_back(byte_id);
                }
            }
            i += len;
        }
        auto lookup = [&](int32_t l, int32_t r) -> PairMerge {
            const int32_t result =
                find_token(index_, vocab_.tokens[ids[l]] + vocab_.tokens[ids[r]]);
            if (result < 0) return {};
            return {result, static_cast<size_t>(result) < vocab_.scores.size()
                                ? vocab_.scores[result]
                                : 0.0f};
        };
        // run.c only merges pairs scoring above -1e10.
        std::vector<int32_t> out;
        for (int32_t i : merge_by_score(&ids, -1e10f, lookup, [](int32_t, int32_t) {})) {
            out.push_back(ids[i]);
        }
        return out;
    }

    std::string token_to_piece(int32_t id, int32_t prev_id, bool render_special) const override {
        if (id < 0 || id >= vocab_size()) return {};
        const TokenType type = token_type(vocab_, id);
        if (type == TokenType::kControl || type == TokenType::kUnknown) {
            return render_special ? vocab_.tokens[id] : std::string();
        }
        std::string_view piece = vocab_.tokens[id];
        // After BOS, SentencePiece strips the dummy prefix's space.
        if (prev_id == vocab_.bos_id && !piece.empty() && piece[0] == ' ') piece.remove_prefix(1);
        unsigned char byte = 0;
        if (std::sscanf(std::string(piece).c_str(), "<0x%02hhX>", &byte) == 1) {
            return std::string(1, static_cast<char>(byte));
        }
        return std::string(piece);
    }

  private:
    TokenIndex index_;
};

// Reads the whole file; errors name it.
Result<std::string> read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return not_found("cannot open llama2.c tokenizer " + path);
    std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) return data_loss("error reading llama2.c tokenizer " + path);
    return data;
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> make_spm_tokenizer(Vocab vocab) {
    const size_t n = vocab.tokens.size();
    if (n == 0) return invalid_argument("SentencePiece vocabulary is empty");
    if ((!vocab.types.empty() && vocab.types.size() != n) ||
        (!vocab.scores.empty() && vocab.scores.size() != n)) {
        return invalid_argument("SentencePiece vocabulary has " + std::to_string(n) +
                                " tokens but " + std::to_string(vocab.types.size()) +
                                " types and " + std::to_string(vocab.scores.size()) + " scores");
    }
    for (int32_t id : {vocab.bos_id, vocab.eos_id, vocab.unk_id, vocab.pad_id}) {
        if (id >= static_cast<int32_t>(n)) {
            return invalid_argument("special token id " + std::to_string(id) +
                                    " is outside the vocabulary of " + std::to_string(n));
        }
    }
    fill_default_eog_ids(&vocab);
    respell_space_runs(&vocab);
    return std::unique_ptr<Tokenizer>(new SpmTokenizer(std::move(vocab)));
}

Result<std::unique_ptr<Tokenizer>> load_llama2c_tokenizer(const std::string& path,
                                                          int32_t vocab_size) {
    if (vocab_size < 3) {
        return invalid_argument("llama2.c tokenizer " + path + ": vocab_size " +
                                std::to_string(vocab_size) + " is too small");
    }
    DS_ASSIGN_OR_RETURN(const std::string data, read_file(path));
    auto truncated = [&](size_t offset, int32_t token) {
        return data_loss("llama2.c tokenizer " + path + " is truncated at byte " +
                         std::to_string(offset) + " (token " + std::to_string(token) + " of " +
                         std::to_string(vocab_size) + ")");
    };
    if (data.size() < 4) return truncated(data.size(), 0);
    uint32_t max_token_length = 0;
    std::memcpy(&max_token_length, data.data(), 4);
    Vocab vocab;
    vocab.tokens.reserve(vocab_size);
    vocab.scores.reserve(vocab_size);
    size_t off = 4;
    for (int32_t i = 0; i < vocab_size; ++i) {
        if (data.size() - off < 8) return truncated(off, i);
        float score = 0;
        int32_t len = 0;
        std::memcpy(&score, data.data() + off, 4);
        std::memcpy(&len, data.data() + off + 4, 4);
        off += 8;
        if (len < 0 || static_cast<uint32_t>(len) > max_token_length) {
            return data_loss("llama2.c tokenizer " + path + ": token " + std::to_string(i) +
                             " has length " + std::to_string(len) + " (max_token_length " +
                             std::to_string(max_token_length) + ") at byte " +
                             std::to_string(off - 4));
        }
        if (data.size() - off < static_cast<size_t>(len)) return truncated(off, i);
        vocab.tokens.emplace_back(data.data() + off, len);
        vocab.scores.push_back(score);
        off += len;
    }
    // Layout of llama2.c's sentencepiece export: <unk>, <s>, </s>, 256 byte tokens, pieces.
    vocab.types.assign(vocab_size, TokenType::kNormal);
    vocab.types[0] = TokenType::kUnknown;
    vocab.types[1] = TokenType::kControl;
    vocab.types[2] = TokenType::kControl;
    for (int32_t i = 3; i < vocab_size && i < 259; ++i) {
        if (parse_byte_token(vocab.tokens[i]) == i - 3) vocab.types[i] = TokenType::kByte;
    }
    vocab.unk_id = 0;
    vocab.bos_id = 1;
    vocab.eos_id = 2;
    vocab.add_bos = true;
    vocab.add_space_prefix = true;
    vocab.pre = "llama2c";
    vocab.eog_ids = {2};
    return std::unique_ptr<Tokenizer>(new Llama2cTokenizer(std::move(vocab)));
}

}  // namespace deltaserve::model
