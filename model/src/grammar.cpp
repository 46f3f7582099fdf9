#include "deltaserve/model/grammar.h"

#include <string>

namespace deltaserve::model {

namespace json_string {

namespace {

// States: 0 between characters; 1 after a backslash; 2..5 in \u with 4..1 hex digits to
// come, 13 after \uD (the next digit 0-7: no surrogate halves, which JSON parsers refuse
// unpaired); 6..8 in a UTF-8 character with 1..3 continuation bytes to come; 9..12 after a
// lead byte whose next byte has a narrower range (E0, ED, F0, F4: no overlong forms, no
// surrogates, nothing past U+10FFFF).
constexpr uint8_t kEscape = 1, kHex4 = 2, kHex3 = 3, kCont1 = 6, kCont2 = 7, kCont3 = 8,
                  kAfterE0 = 9, kAfterED = 10, kAfterF0 = 11, kAfterF4 = 12, kAfterUD = 13;

bool hex(unsigned char b) {
    return (b >= '0' && b <= '9') || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F');
}

bool in(unsigned char b, unsigned lo, unsigned hi) { return b >= lo && b <= hi; }

}  // namespace

uint8_t next(uint8_t state, unsigned char b) {
    switch (state) {
        case kStart:
            if (b == '"') return kClosed;
            if (b == '\\') return kEscape;
            if (in(b, 0x20, 0x7F)) return kStart;
            if (in(b, 0xC2, 0xDF)) return kCont1;
            if (b == 0xE0) return kAfterE0;
            if (b == 0xED) return kAfterED;
            if (in(b, 0xE1, 0xEF)) return kCont2;
            if (b == 0xF0) return kAfterF0;
            if (in(b, 0xF1, 0xF3)) return kCont3;
            if (b == 0xF4) return kAfterF4;
            return kDead;
        case kEscape:
            if (b == 'u') return kHex4;
            for (char c : std::string_view("\"\\/bfnrt"))
                if (b == static_cast<unsigned char>(c)) return kStart;
            return kDead;
        case kHex4:
            if (b == 'd' || b == 'D') return kAfterUD;
            return hex(b) ? kHex3 : kDead;
        case kAfterUD:
            return in(b, '0', '7') ? kHex3 + 1 : kDead;
        case kHex3:
        case kHex3 + 1:
            return hex(b) ? state + 1 : kDead;
        case kHex3 + 2:
            return hex(b) ? kStart : kDead;
        case kCont1:
            return in(b, 0x80, 0xBF) ? kStart : kDead;
        case kCont2:
            return in(b, 0x80, 0xBF) ? kCont1 : kDead;
        case kCont3:
            return in(b, 0x80, 0xBF) ? kCont2 : kDead;
        case kAfterE0:
            return in(b, 0xA0, 0xBF) ? kCont1 : kDead;
        case kAfterED:
            return in(b, 0x80, 0x9F) ? kCont1 : kDead;
        case kAfterF0:
            return in(b, 0x90, 0xBF) ? kCont2 : kDead;
        case kAfterF4:
            return in(b, 0x80, 0x8F) ? kCont2 : kDead;
        default:
            return kDead;
    }
}

}  // namespace json_string

uint32_t Grammar::new_rule() {
    rules_.emplace_back();
    return static_cast<uint32_t>(rules_.size() - 1);
}

void Grammar::add(uint32_t rule, Sequence alternative) {
    DS_CHECK(rule < rules_.size(), "no such grammar rule");
    rules_[rule].push_back(std::move(alternative));
}

GrammarElement Grammar::bytes(const ByteSet& set) {
    for (size_t i = 0; i < sets_.size(); ++i) {
        if (sets_[i] == set) return {GrammarElement::Kind::kBytes, static_cast<uint32_t>(i)};
    }
    sets_.push_back(set);
    return {GrammarElement::Kind::kBytes, static_cast<uint32_t>(sets_.size() - 1)};
}

GrammarElement Grammar::byte(unsigned char b) {
    ByteSet s;
    s.set(b);
    return bytes(s);
}

Grammar::Sequence Grammar::literal(std::string_view text) {
    Sequence seq;
    for (char c : text) seq.push_back(byte(static_cast<unsigned char>(c)));
    return seq;
}

uint32_t Grammar::repeat(const Sequence& item, int32_t min, int32_t max) {
    const uint32_t head = new_rule();
    uint32_t at = head;
    // min required items, each followed by the rest.
    for (int32_t i = 0; i < min; ++i) {
        const uint32_t rest = new_rule();
        Sequence s = item;
        s.push_back(ref(rest));
        add(at, std::move(s));
        at = rest;
    }
    if (max < 0) {
        Sequence s = item;
        s.push_back(ref(at));
        add(at, std::move(s));
        add(at, {});
        return head;
    }
    for (int32_t i = min; i < max; ++i) {
        const uint32_t rest = new_rule();
        Sequence s = item;
        s.push_back(ref(rest));
        add(at, std::move(s));
        add(at, {});
        at = rest;
    }
    add(at, {});
    return head;
}

namespace {

bool consumes(const GrammarElement& e) {
    return e.kind == GrammarElement::Kind::kBytes || e.kind == GrammarElement::Kind::kJsonString;
}

}  // namespace

Status Grammar::finish(size_t max_elements) {
    const size_t n = rules_.size();
    if (root_ >= n) return invalid_argument("grammar: no root rule");
    size_t total = 0;
    for (size_t r = 0; r < n; ++r) {
        if (rules_[r].empty()) {
            return invalid_argument("grammar: rule " + std::to_string(r) + " has no alternative");
        }
        for (const Sequence& alt : rules_[r]) {
            total += alt.size() + 1;
            for (const GrammarElement& e : alt) {
                if (e.kind == GrammarElement::Kind::kRule && e.arg >= n)
                    return invalid_argument("grammar: reference to no rule");
            }
        }
    }
    if (total > max_elements) {
        return invalid_argument("grammar too large: " + std::to_string(total) +
                                " elements (at most " + std::to_string(max_elements) + ")");
    }
    // Nullable rules (they can match no bytes), to a fixpoint.
    std::vector<bool> nullable(n, false);
    for (bool changed = true; changed;) {
        changed = false;
        for (size_t r = 0; r < n; ++r) {
            if (nullable[r]) continue;
            for (const Sequence& alt : rules_[r]) {
                bool all = true;
                for (const GrammarElement& e : alt) {
                    if (consumes(e) || !nullable[e.arg]) {
                        all = false;
                        break;
                    }
                }
                if (all) {
                    nullable[r] = changed = true;
                    break;
                }
            }
        }
    }
    // Rule r "starts with" s when s comes after only nullable rules in one of r's
    // alternatives; a cycle of those never consumes a byte.
    std::vector<std::vector<uint32_t>> starts_with(n);
    for (size_t r = 0; r < n; ++r) {
        for (const Sequence& alt : rules_[r]) {
            for (const GrammarElement& e : alt) {
                if (consumes(e)) break;
                starts_with[r].push_back(e.arg);
                if (!nullable[e.arg]) break;
            }
        }
    }
    std::vector<uint8_t> mark(n, 0);  // 0 new, 1 on the path, 2 done
    std::vector<std::pair<uint32_t, size_t>> path;
    for (size_t s = 0; s < n; ++s) {
        if (mark[s] != 0) continue;
        path.push_back({static_cast<uint32_t>(s), 0});
        mark[s] = 1;
        while (!path.empty()) {
            auto& [r, i] = path.back();
            if (i == starts_with[r].size()) {
                mark[r] = 2;
                path.pop_back();
                continue;
            }
            const uint32_t to = starts_with[r][i++];
            if (mark[to] == 1) {
                return invalid_argument(
                    "grammar: a rule reaches itself without consuming text (left recursion)");
            }
            if (mark[to] == 0) {
                mark[to] = 1;
                path.push_back({to, 0});
            }
        }
    }
    elements_.clear();
    elements_.reserve(total);
    starts_.assign(n, {});
    for (size_t r = 0; r < n; ++r) {
        for (const Sequence& alt : rules_[r]) {
            starts_[r].push_back(static_cast<uint32_t>(elements_.size()));
            elements_.insert(elements_.end(), alt.begin(), alt.end());
            elements_.push_back({});
        }
    }
    return Status();
}

}  // namespace deltaserve::model
