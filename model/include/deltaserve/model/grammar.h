// A context-free grammar over bytes, the form constrained decoding runs: rules of
// alternatives, each a sequence of byte sets, references to rules, and JSON string bodies
// (a small automaton for everything between a string's quotes, escapes and UTF-8 checked).
// Built once (json_schema_grammar.h compiles one from a schema), then finish() checks it
// and lays it out flat for GrammarMatcher; immutable and shareable after that.
#pragma once

#include <bitset>
#include <cstdint>
#include <string_view>
#include <vector>

#include "deltaserve/common/status.h"

namespace deltaserve::model {

using ByteSet = std::bitset<256>;

struct GrammarElement {
    enum class Kind : uint8_t {
        kEnd,         // the end of an alternative
        kBytes,       // one byte of the set sets()[arg]
        kRule,        // the rule arg
        kJsonString,  // a JSON string's text after its opening quote, through the closing one
    };
    Kind kind = Kind::kEnd;
    uint32_t arg = 0;
};

// The automaton of a JSON string body: states 0 (between characters) to 13, and what a
// byte leads to from one of them.
namespace json_string {
constexpr uint8_t kStart = 0;
constexpr uint8_t kClosed = 14;  // the byte was the closing quote
constexpr uint8_t kDead = 15;    // the byte cannot come here
uint8_t next(uint8_t state, unsigned char byte);
}  // namespace json_string

class Grammar {
  public:
    using Sequence = std::vector<GrammarElement>;

    // Building.
    uint32_t new_rule();
    void add(uint32_t rule, Sequence alternative);
    static GrammarElement ref(uint32_t rule) { return {GrammarElement::Kind::kRule, rule}; }
    static GrammarElement json_string_body() { return {GrammarElement::Kind::kJsonString, 0}; }
    GrammarElement bytes(const ByteSet& set);
    GrammarElement byte(unsigned char b);
    Sequence literal(std::string_view text);
    // A rule matching `item` repeated min to max times (max < 0: no bound).
    uint32_t repeat(const Sequence& item, int32_t min, int32_t max);
    void set_root(uint32_t rule) { root_ = rule; }

    // Lays the rules out for matching. kInvalidArgument when a rule has no alternative, the
    // grammar is over max_elements, or a rule can reach itself without consuming a byte
    // (matching it would never end).
    Status finish(size_t max_elements = size_t{1} << 20);

    // After finish(): elements() holds every alternative, each closed by kEnd;
    // alternatives(r) the index in elements() where each of rule r's starts.
    const std::vector<GrammarElement>& elements() const { return elements_; }
    const std::vector<uint32_t>& alternatives(uint32_t rule) const { return starts_[rule]; }
    const std::vector<ByteSet>& sets() const { return sets_; }
    uint32_t root() const { return root_; }
    size_t rule_count() const { return rules_.size(); }

  private:
    std::vector<std::vector<Sequence>> rules_;
    std::vector<ByteSet> sets_;
    std::vector<GrammarElement> elements_;
    std::vector<std::vector<uint32_t>> starts_;
    uint32_t root_ = 0;
};

}  // namespace deltaserve::model
