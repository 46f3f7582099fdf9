#include "pre_tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdio>

#include "unicode.h"

namespace deltaserve::model {
namespace {

// One fragment of code points being split; positions past the end have no class, like
// llama.cpp's OUT_OF_RANGE handling.
class Splitter {
  public:
    Splitter(std::span<const uint32_t> cps, std::vector<size_t>* out) : cps_(cps), out_(out) {}

    size_t size() const { return cps_.size(); }
    uint32_t at(size_t p) const { return p < cps_.size() ? cps_[p] : kOutOfRange; }
    bool letter(size_t p) const { return p < cps_.size() && unicode::is_letter(cps_[p]); }
    bool number(size_t p) const { return p < cps_.size() && unicode::is_number(cps_[p]); }
    bool space(size_t p) const { return p < cps_.size() && unicode::is_whitespace(cps_[p]); }
    // [^\s\p{L}\p{N}]: any other code point inside the fragment.
    bool other(size_t p) const { return p < cps_.size() && !letter(p) && !number(p) && !space(p); }
    bool newline(size_t p) const { return at(p) == '\r' || at(p) == '\n'; }

    // Emits the word ending at end (if not empty); returns its length.
    size_t add(size_t end) {
        const size_t len = end - prev_end_;
        if (len > 0) out_->push_back(len);
        prev_end_ = end;
        return len;
    }

    // 's|'t|'re|'ve|'m|'ll|'d (case-insensitive when fold_case); 0 when none matches.
    size_t contraction(size_t pos, bool fold_case) const {
        if (at(pos) != '\'' || pos + 1 >= size()) return 0;
        auto lower = [&](uint32_t c) { return fold_case ? unicode::to_lower_ascii(c) : c; };
        const uint32_t c1 = lower(at(pos + 1));
        if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
        if (pos + 2 >= size()) return 0;
        const uint32_t c2 = lower(at(pos + 2));
        if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
            return 3;
        }
        return 0;
    }

    // \s+(?!\S)|\s+ for a run of n_space spaces at pos: where its word ends. A run followed by
    // a non-space leaves its last space to that word; with no run, the lone code point at pos
    // is a word of its own.
    size_t space_run_end(size_t pos, size_t n_space) const {
        if (n_space > 1 && pos + n_space < size()) return pos + n_space - 1;
        if (n_space > 0) return pos + n_space;
        return pos + 1;
    }

    static constexpr uint32_t kOutOfRange = 0xFFFFFFFF;

  private:
    std::span<const uint32_t> cps_;
    std::vector<size_t>* out_;
    size_t prev_end_ = 0;
};

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
void split_gpt2(std::span<const uint32_t> cps, std::vector<size_t>* out) {
    Splitter s(cps, out);
    for (size_t pos = 0; pos < s.size();) {
        const uint32_t cp = s.at(pos);
        if (const size_t n = s.contraction(pos, /*fold_case=*/false)) {
            pos += s.add(pos + n);
            continue;
        }
        // The optional leading space: classify the code point after it.
        const size_t q = cp == ' ' ? pos + 1 : pos;
        if (s.letter(q) || s.number(q) || s.other(q)) {
            bool (Splitter::*cls)(size_t) const = s.letter(q)   ? &Splitter::letter
                                                  : s.number(q) ? &Splitter::number
                                                                : &Splitter::other;
            pos = q;
            while ((s.*cls)(pos)) ++pos;
            s.add(pos);
            continue;
        }
        size_t n_space = 0;
        while (s.space(pos + n_space)) ++n_space;
        pos = s.space_run_end(pos, n_space);
        s.add(pos);
    }
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}|
//  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
void split_llama3(std::span<const uint32_t> cps, size_t max_digits, std::vector<size_t>* out) {
    Splitter s(cps, out);
    for (size_t pos = 0; pos < s.size();) {
        const uint32_t cp = s.at(pos);
        if (const size_t n = s.contraction(pos, /*fold_case=*/true)) {
            pos += s.add(pos + n);
            continue;
        }
        if (!s.newline(pos) && !s.number(pos) && (s.letter(pos) || s.letter(pos + 1))) {
            ++pos;  // the letter, or the one leading non-letter
            while (s.letter(pos)) ++pos;
            s.add(pos);
            continue;
        }
        if (s.number(pos)) {
            size_t start = pos;
            while (s.number(pos)) {
                if (++pos - start >= max_digits) {
                    s.add(pos);
                    start = pos;
                }
            }
            s.add(pos);
            continue;
        }
        const size_t q = cp == ' ' ? pos + 1 : pos;
        // llama.cpp also takes this branch for a lone trailing space; the word is the same.
        if (!s.letter(q) && !s.number(q) && !s.space(q)) {
            pos = q;
            while (s.other(pos)) ++pos;
            while (s.newline(pos)) ++pos;
            s.add(pos);
            continue;
        }
        size_t n_space = 0;
        size_t last_newline_end = 0;
        while (s.space(pos + n_space)) {
            if (s.newline(pos + n_space)) last_newline_end = pos + n_space + 1;
            ++n_space;
        }
        if (last_newline_end > 0) {  // \s*[\r\n]+
            pos = last_newline_end;
            s.add(pos);
            continue;
        }
        pos = s.space_run_end(pos, n_space);
        s.add(pos);
    }
}

// \p{N}: every number code point alone; the runs between them stay whole.
void split_digits(std::span<const uint32_t> cps, std::vector<size_t>* out) {
    size_t run = 0;
    for (uint32_t cp : cps) {
        if (unicode::is_number(cp)) {
            if (run > 0) out->push_back(run);
            out->push_back(1);
            run = 0;
        } else {
            ++run;
        }
    }
    if (run > 0) out->push_back(run);
}

}  // namespace

Result<PreTokenizerKind> pre_tokenizer_from_name(std::string_view pre) {
    static constexpr std::array<std::string_view, 7> kGpt2 = {"gpt2", "gpt-2", "phi-2",  "mpt",
                                                              "olmo", "jais",  "exaone4"};
    static constexpr std::array<std::string_view, 8> kSmolLM = {"smollm",     "starcoder", "refact",
                                                                "command-r",  "codeshell", "exaone",
                                                                "minerva-7b", "mellum2"};
    static constexpr std::array<std::string_view, 9> kLlama3 = {
        "llama3",  "llama-v3", "llama-bpe", "falcon3",  "falcon-h1",
        "pixtral", "midm-2.0", "dbrx",      "smaug-bpe"};
    static constexpr std::array<std::string_view, 5> kQwen2 = {"qwen2", "deepseek-r1-qwen",
                                                               "stablelm2", "megrez", "hunyuan"};
    auto in = [&](const auto& names) {
        return std::find(names.begin(), names.end(), pre) != names.end();
    };
    if (in(kGpt2)) return PreTokenizerKind::kGpt2;
    if (in(kSmolLM)) return PreTokenizerKind::kSmolLM;
    if (in(kLlama3)) return PreTokenizerKind::kLlama3;
    if (in(kQwen2)) return PreTokenizerKind::kQwen2;
    return unimplemented("BPE pre-tokenizer '" + std::string(pre) +
                         "' is not supported (known: gpt2, smollm, llama3, qwen2 families)");
}

bool pre_tokenizer_ignores_merges(std::string_view pre) {
    return pre == "llama3" || pre == "llama-v3" || pre == "llama-bpe" || pre == "falcon3" ||
           pre == "falcon-h1" || pre == "pixtral" || pre == "midm-2.0";
}

std::vector<size_t> pre_tokenize(PreTokenizerKind kind, std::span<const uint32_t> cps) {
    std::vector<size_t> words;
    switch (kind) {
        case PreTokenizerKind::kGpt2:
            split_gpt2(cps, &words);
            break;
        case PreTokenizerKind::kSmolLM: {
            std::vector<size_t> pieces;
            split_digits(cps, &pieces);
            size_t start = 0;
            for (size_t len : pieces) {
                split_gpt2(cps.subspan(start, len), &words);
                start += len;
            }
            break;
        }
        case PreTokenizerKind::kLlama3:
            split_llama3(cps, 3, &words);
            break;
        case PreTokenizerKind::kQwen2:
            split_llama3(cps, 1, &words);
            break;
    }
    return words;
}

SpecialTokenSplitter::SpecialTokenSplitter(const Vocab& vocab) {
    for (size_t id = 0; id < vocab.tokens.size(); ++id) {
        const TokenType type = token_type(vocab, static_cast<int32_t>(id));
        if (type != TokenType::kControl && type != TokenType::kUserDefined &&
            type != TokenType::kUnknown) {
            continue;
        }
        if (vocab.tokens[id].empty()) continue;
        specials_.push_back(
            {static_cast<int32_t>(id), vocab.tokens[id], type == TokenType::kUserDefined});
    }
    std::stable_sort(specials_.begin(), specials_.end(), [](const Special& a, const Special& b) {
        return a.text.size() > b.text.size();
    });
}

namespace {

bool overlaps(size_t b, size_t e, std::span<const std::pair<size_t, size_t>> ranges) {
    const auto it = std::lower_bound(ranges.begin(), ranges.end(), b,
                                     [](const auto& r, size_t at) { return r.second <= at; });
    return it != ranges.end() && it->first < e;
}

}  // namespace

std::vector<TextFragment> SpecialTokenSplitter::split(
    std::string_view text, bool parse_special,
    std::span<const std::pair<size_t, size_t>> plain) const {
    std::vector<TextFragment> fragments;
    if (text.empty()) return fragments;
    fragments.push_back({-1, 0, text.size()});
    std::vector<TextFragment> next;
    for (const Special& special : specials_) {
        if (!parse_special && !special.always) continue;
        next.clear();
        bool found = false;
        for (const TextFragment& f : fragments) {
            if (f.token >= 0) {
                next.push_back(f);
                continue;
            }
            size_t begin = f.offset;
            const size_t end = f.offset + f.length;
            size_t from = begin;
            while (from < end) {
                const size_t match = text.substr(0, end).find(special.text, from);
                if (match == std::string_view::npos) break;
                if (!special.always && overlaps(match, match + special.text.size(), plain)) {
                    from = match + 1;  // the user's text: not a control token
                    continue;
                }
                found = true;
                if (match > begin) next.push_back({-1, begin, match - begin});
                next.push_back({special.id, 0, 0});
                begin = match + special.text.size();
                from = begin;
            }
            if (begin < end) next.push_back({-1, begin, end - begin});
        }
        if (found) fragments.swap(next);
    }
    return fragments;
}

void fill_default_eog_ids(Vocab* vocab) {
    if (!vocab->eog_ids.empty()) return;
    static constexpr std::array<std::string_view, 22> kEogTexts = {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
        "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>",
        // FIM pad / repo / file-separator tokens end generation too in llama.cpp.
        "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "<|fim_repo|>", "<|repo_name|>",
        "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>", "<|return|>", "<|call|>"};
    for (size_t id = 0; id < vocab->tokens.size(); ++id) {
        const std::string& t = vocab->tokens[id];
        if (std::find(kEogTexts.begin(), kEogTexts.end(), t) != kEogTexts.end()) {
            vocab->eog_ids.push_back(static_cast<int32_t>(id));
        }
    }
    if (vocab->eos_id >= 0 && std::find(vocab->eog_ids.begin(), vocab->eog_ids.end(),
                                        vocab->eos_id) == vocab->eog_ids.end()) {
        vocab->eog_ids.push_back(vocab->eos_id);
    }
}

int parse_byte_token(const std::string& text) {
    unsigned int value = 0;
    char tail = 0;
    if (text.size() == 6 && std::sscanf(text.c_str(), "<0x%2X%c", &value, &tail) == 2 &&
        tail == '>') {
        return static_cast<int>(value);
    }
    return -1;
}

}  // namespace deltaserve::model
