#include "deltaserve/model/grammar_matcher.h"

#include <algorithm>

namespace deltaserve::model {

namespace {

using Kind = GrammarElement::Kind;

uint32_t at(uint32_t element, uint8_t state = 0) { return element << 4 | state; }
uint32_t element_of(uint32_t pos) { return pos >> 4; }
uint8_t state_of(uint32_t pos) { return static_cast<uint8_t>(pos & 15); }

void sort_unique(std::vector<GrammarStack>& stacks) {
    std::sort(stacks.begin(), stacks.end());
    stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
}

}  // namespace

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar)
    : grammar_(std::move(grammar)) {
    DS_CHECK(!grammar_->elements().empty(), "matching an unfinished grammar");
    for (uint32_t start : grammar_->alternatives(grammar_->root())) {
        expand({at(start)}, stacks_);
    }
    sort_unique(stacks_);
}

void GrammarMatcher::expand(GrammarStack stack, std::vector<GrammarStack>& out) const {
    const std::vector<GrammarElement>& el = grammar_->elements();
    while (!stack.empty()) {
        const uint32_t e = element_of(stack.back());
        const GrammarElement& g = el[e];
        if (g.kind == Kind::kEnd) {
            stack.pop_back();
            continue;
        }
        if (g.kind != Kind::kRule) break;
        // Opening a rule: its continuation stays below (left out when nothing follows, so
        // right recursion does not grow the stack), each alternative on top. finish()
        // refused rules that reach themselves without a byte, so this ends.
        stack.pop_back();
        if (el[e + 1].kind != Kind::kEnd) stack.push_back(at(e + 1));
        const std::vector<uint32_t>& alts = grammar_->alternatives(g.arg);
        for (size_t i = 0; i + 1 < alts.size(); ++i) {
            GrammarStack copy = stack;
            copy.push_back(at(alts[i]));
            expand(std::move(copy), out);
        }
        stack.push_back(at(alts.back()));
    }
    out.push_back(std::move(stack));
}

void GrammarMatcher::advance(const GrammarStack& stack, unsigned char byte,
                             std::vector<GrammarStack>& out) const {
    if (stack.empty()) return;
    const uint32_t e = element_of(stack.back());
    const GrammarElement& g = grammar_->elements()[e];
    if (g.kind == Kind::kBytes) {
        if (!grammar_->sets()[g.arg].test(byte)) return;
        GrammarStack next = stack;
        next.back() = at(e + 1);
        expand(std::move(next), out);
    } else if (g.kind == Kind::kJsonString) {
        const uint8_t s = json_string::next(state_of(stack.back()), byte);
        if (s == json_string::kDead) return;
        GrammarStack next = stack;
        if (s == json_string::kClosed) {
            next.back() = at(e + 1);
            expand(std::move(next), out);
        } else {
            next.back() = at(e, s);
            out.push_back(std::move(next));
        }
    }
}

void GrammarMatcher::advance_all(const std::vector<GrammarStack>& from, unsigned char byte,
                                 std::vector<GrammarStack>& out) const {
    out.clear();
    for (const GrammarStack& s : from) advance(s, byte, out);
    if (out.size() > 1) sort_unique(out);
}

bool GrammarMatcher::accept(std::string_view text) {
    std::vector<GrammarStack> cur = stacks_, next;
    for (char c : text) {
        advance_all(cur, static_cast<unsigned char>(c), next);
        if (next.empty()) return false;
        cur.swap(next);
    }
    stacks_ = std::move(cur);
    return true;
}

bool GrammarMatcher::can_end() const {
    return std::any_of(stacks_.begin(), stacks_.end(),
                       [](const GrammarStack& s) { return s.empty(); });
}

bool GrammarMatcher::must_end() const {
    return !stacks_.empty() && std::all_of(stacks_.begin(), stacks_.end(),
                                           [](const GrammarStack& s) { return s.empty(); });
}

}  // namespace deltaserve::model
