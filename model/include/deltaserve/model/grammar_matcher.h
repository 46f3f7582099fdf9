// Where a text is in a Grammar, byte by byte: the set of parse stacks that match it so far
// (as llama.cpp's grammar sampler keeps them), each a list of positions in the grammar's
// elements, the innermost last, each top a byte to match next (or none: the text may end).
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "deltaserve/model/grammar.h"

namespace deltaserve::model {

// A position: an index in Grammar::elements() times 16, plus the JSON string automaton's
// state when the element is a kJsonString.
using GrammarStack = std::vector<uint32_t>;

class GrammarMatcher {
  public:
    // The grammar must be finished.
    explicit GrammarMatcher(std::shared_ptr<const Grammar> grammar);

    // Matches more text: false when it cannot continue the grammar (the state is then as
    // before the call).
    bool accept(std::string_view text);
    // The text so far is a whole match (it may also go on).
    bool can_end() const;
    // The text so far is a whole match that cannot go on.
    bool must_end() const;
    const std::vector<GrammarStack>& stacks() const { return stacks_; }
    const Grammar& grammar() const { return *grammar_; }

    // The stacks `stack` becomes after `byte`, appended to out (none if it cannot take it).
    void advance(const GrammarStack& stack, unsigned char byte,
                 std::vector<GrammarStack>& out) const;
    // The same for every stack of `from`, sorted and without repeats.
    void advance_all(const std::vector<GrammarStack>& from, unsigned char byte,
                     std::vector<GrammarStack>& out) const;
    // Appends the stacks a stack stands for once its top rules are opened (each ends with a
    // byte to match, or is empty).
    void expand(GrammarStack stack, std::vector<GrammarStack>& out) const;

  private:
    std::shared_ptr<const Grammar> grammar_;
    std::vector<GrammarStack> stacks_;
};

}  // namespace deltaserve::model
