// Constrained decoding: which tokens of the vocabulary can continue a grammar, as a mask the
// sampler applies (llama.cpp's grammar sampler, vLLM's xgrammar, SGLang do the same).
//
// A mask is the union, over the parse stacks, of each stack's mask, and a stack's mask is
// kept (a turn meets the same stacks again and again: every character of a string leaves it
// where it was). A stack inside a JSON string is answered from tables made once per
// vocabulary: the tokens that stay inside the string from each state of its automaton, and
// the few that close it, matched on from there. Any other stack walks the vocabulary in byte
// order, sharing the work of common prefixes and skipping every token under a dead one.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "deltaserve/model/grammar_matcher.h"
#include "deltaserve/model/tokenizer.h"

namespace deltaserve::model {

// The vocabulary as constrained decoding sees it: each token's bytes in the answer (none for
// a control token), in byte order, and the JSON string tables. Immutable once made.
class GrammarVocab {
  public:
    explicit GrammarVocab(const Tokenizer& tokenizer);

    size_t size() const { return pieces_.size(); }
    size_t words() const { return (pieces_.size() + 63) / 64; }
    const std::string& piece(int32_t id) const { return pieces_[id]; }
    const std::vector<int32_t>& eog() const { return eog_; }

    // Tokens with bytes, sorted by them; lcp(i): bytes sorted()[i] shares with the one
    // before it; first_byte_end(b): the end in sorted() of the tokens starting with b.
    const std::vector<int32_t>& sorted() const { return sorted_; }
    uint32_t lcp(size_t i) const { return lcp_[i]; }
    size_t first_byte_end(unsigned char b) const { return byte_end_[b]; }

    // From JSON string state s: the tokens whose bytes all stay inside the string, and the
    // tokens that close it (with where their bytes after the closing quote begin).
    const std::vector<uint64_t>& stay_in_string(uint8_t s) const { return stay_[s]; }
    const std::vector<std::pair<int32_t, uint32_t>>& close_string(uint8_t s) const {
        return close_[s];
    }

  private:
    std::vector<std::string> pieces_;
    std::vector<int32_t> eog_;
    std::vector<int32_t> sorted_;
    std::vector<uint32_t> lcp_;
    size_t byte_end_[256] = {};
    std::vector<std::vector<uint64_t>> stay_;
    std::vector<std::vector<std::pair<int32_t, uint32_t>>> close_;
};

class TokenConstraint {
  public:
    TokenConstraint(std::shared_ptr<const Grammar> grammar,
                    std::shared_ptr<const GrammarVocab> vocab);

    // The tokens that can come next, bit i % 64 of word i / 64 for token i: those whose bytes
    // continue the grammar, and the end-of-generation tokens where the text may end. Valid
    // until the next call.
    std::span<const uint64_t> allowed();
    // Takes the next token: false (nothing changes) when it cannot come here.
    bool accept(int32_t token);
    // The text is a whole match and nothing can follow it.
    bool must_end() const { return matcher_.must_end(); }

    struct Stats {
        uint64_t masks = 0;        // allowed() calls
        uint64_t stacks_made = 0;  // stack masks computed (the rest came from the cache)
    };
    const Stats& stats() const { return stats_; }

  private:
    const std::vector<uint64_t>& stack_mask(const GrammarStack& stack);
    void walk_vocab(const GrammarStack& stack, std::vector<uint64_t>& mask);
    void close_string(const GrammarStack& stack, std::vector<uint64_t>& mask);
    bool matches(const std::vector<GrammarStack>& from, std::string_view bytes);

    std::shared_ptr<const GrammarVocab> vocab_;
    GrammarMatcher matcher_;
    std::vector<uint64_t> mask_;
    std::unordered_map<std::string, std::vector<uint64_t>> cache_;
    std::vector<std::vector<GrammarStack>> levels_;  // the vocabulary walk's states by depth
    std::vector<GrammarStack> scratch_a_, scratch_b_;
    Stats stats_;
};

}  // namespace deltaserve::model
