// Python's str operations over UTF-8 code points.
#include "jinja_strings.h"

#include <algorithm>

#include "jinja_format.h"
#include "unicode.h"

namespace deltaserve::model::jinja {
namespace {

struct CodePoints {
    std::vector<size_t> at;
    std::vector<uint32_t> cp;
    explicit CodePoints(std::string_view s) : at(code_points(s)) {
        for (size_t i = 0; i + 1 < at.size(); ++i) cp.push_back(decode_code_point(s, at[i]));
    }
    size_t size() const { return cp.size(); }
};

// ASCII and Latin-1 letters (U+00C0..U+00FE but the signs; U+00DF and U+00FF have no
// single-code-point partner in Latin-1 and stay).
bool is_upper(uint32_t c) {
    return (c >= 'A' && c <= 'Z') || (c >= 0xC0 && c <= 0xDE && c != 0xD7);
}
bool is_lower(uint32_t c) {
    return (c >= 'a' && c <= 'z') || (c >= 0xDF && c <= 0xFF && c != 0xF7);
}
uint32_t to_upper(uint32_t c) {
    if (c >= 'a' && c <= 'z') return c - 32;
    if (c >= 0xE0 && c <= 0xFE && c != 0xF7) return c - 32;
    return c;
}
uint32_t to_lower(uint32_t c) {
    if (c >= 'A' && c <= 'Z') return c + 32;
    if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 32;
    return c;
}

}  // namespace

std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                  bool right) {
    const CodePoints p(s);
    std::vector<uint32_t> set;
    if (chars) {
        const CodePoints c(*chars);
        set = c.cp;
    }
    const auto strippable = [&](uint32_t c) {
        return chars ? std::find(set.begin(), set.end(), c) != set.end() : is_py_space(c);
    };
    size_t b = 0, e = p.size();
    if (left) {
        while (b < e && strippable(p.cp[b])) ++b;
    }
    if (right) {
        while (e > b && strippable(p.cp[e - 1])) --e;
    }
    return std::string(s.substr(p.at[b], p.at[e] - p.at[b]));
}

std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep,
                               int64_t maxsplit, bool from_right) {
    std::vector<std::string> out;
    if (sep) {
        if (!from_right) {
            size_t from = 0;
            while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
                const size_t at = s.find(*sep, from);
                if (at == std::string_view::npos) break;
                out.emplace_back(s.substr(from, at - from));
                from = at + sep->size();
            }
            out.emplace_back(s.substr(from));
            return out;
        }
        size_t end = s.size();
        std::vector<std::string> rev;
        while (maxsplit < 0 || static_cast<int64_t>(rev.size()) < maxsplit) {
            if (end < sep->size()) break;
            const size_t at = s.rfind(*sep, end - sep->size());
            if (at == std::string_view::npos) break;
            rev.emplace_back(s.substr(at + sep->size(), end - at - sep->size()));
            end = at;
        }
        rev.emplace_back(s.substr(0, end));
        return std::vector<std::string>(rev.rbegin(), rev.rend());
    }
    // Runs of whitespace.
    const CodePoints p(s);
    std::vector<std::pair<size_t, size_t>> words;
    size_t i = 0;
    while (i < p.size()) {
        while (i < p.size() && is_py_space(p.cp[i])) ++i;
        if (i == p.size()) break;
        size_t j = i;
        while (j < p.size() && !is_py_space(p.cp[j])) ++j;
        words.emplace_back(i, j);
        i = j;
    }
    if (maxsplit >= 0 && static_cast<int64_t>(words.size()) > maxsplit + 1) {
        if (!from_right) {
            const size_t keep = static_cast<size_t>(maxsplit);
            std::string rest(s.substr(p.at[words[keep].first]));  // trailing whitespace kept
            for (size_t k = 0; k < keep; ++k) {
                out.emplace_back(
                    s.substr(p.at[words[k].first], p.at[words[k].second] - p.at[words[k].first]));
            }
            out.push_back(std::move(rest));
            return out;
        }
        const size_t first = words.size() - static_cast<size_t>(maxsplit);
        out.emplace_back(s.substr(0, p.at[words[first - 1].second]));  // leading whitespace kept
        for (size_t k = first; k < words.size(); ++k) {
            out.emplace_back(
                s.substr(p.at[words[k].first], p.at[words[k].second] - p.at[words[k].first]));
        }
        return out;
    }
    for (const auto& [b, e] : words) out.emplace_back(s.substr(p.at[b], p.at[e] - p.at[b]));
    return out;
}

std::vector<std::string> split_lines(std::string_view s) {
    const CodePoints p(s);
    std::vector<std::string> out;
    size_t start = 0;
    for (size_t i = 0; i < p.size(); ++i) {
        const uint32_t c = p.cp[i];
        const bool brk = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C ||
                         c == 0x1D || c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
        if (!brk) continue;
        out.emplace_back(s.substr(p.at[start], p.at[i] - p.at[start]));
        if (c == '\r' && i + 1 < p.size() && p.cp[i + 1] == '\n') ++i;
        start = i + 1;
    }
    if (start < p.size()) out.emplace_back(s.substr(p.at[start]));
    return out;
}

std::string replace(std::string_view s, std::string_view old, std::string_view with,
                    int64_t count) {
    std::string out;
    if (old.empty()) {
        // Python puts `with` before every code point and at the end.
        const CodePoints p(s);
        int64_t n = 0;
        for (size_t i = 0; i <= p.size(); ++i) {
            if (count < 0 || n < count) {
                out.append(with);
                ++n;
            }
            if (i < p.size()) out.append(s.substr(p.at[i], p.at[i + 1] - p.at[i]));
        }
        return out;
    }
    size_t from = 0;
    int64_t n = 0;
    while (count < 0 || n < count) {
        const size_t at = s.find(old, from);
        if (at == std::string_view::npos) break;
        out.append(s.substr(from, at - from));
        out.append(with);
        from = at + old.size();
        ++n;
    }
    out.append(s.substr(from));
    return out;
}

int64_t count_of(std::string_view s, std::string_view sub) {
    if (sub.empty()) return static_cast<int64_t>(code_points(s).size());
    int64_t n = 0;
    for (size_t at = s.find(sub); at != std::string_view::npos; at = s.find(sub, at + sub.size()))
        ++n;
    return n;
}

std::string change_case(std::string_view s, std::string_view how) {
    const CodePoints p(s);
    std::string out;
    bool prev_cased = false;
    for (size_t i = 0; i < p.size(); ++i) {
        const uint32_t c = p.cp[i];
        uint32_t r = c;
        if (how == "upper") {
            r = to_upper(c);
        } else if (how == "lower") {
            r = to_lower(c);
        } else if (how == "swapcase") {
            r = is_upper(c) ? to_lower(c) : to_upper(c);
        } else if (how == "capitalize") {
            r = i == 0 ? to_upper(c) : to_lower(c);
        } else {  // title
            r = prev_cased ? to_lower(c) : to_upper(c);
            prev_cased = is_upper(c) || is_lower(c);
        }
        if (r == c) {
            out.append(s.substr(p.at[i], p.at[i + 1] - p.at[i]));
        } else {
            unicode::append_utf8(r, &out);
        }
    }
    return out;
}

bool char_class(std::string_view s, std::string_view which) {
    const CodePoints p(s);
    if (which == "islower" || which == "isupper") {
        bool cased = false;
        for (uint32_t c : p.cp) {
            if (which == "islower" ? is_upper(c) : is_lower(c)) return false;
            cased = cased || is_upper(c) || is_lower(c);
        }
        return cased;
    }
    if (p.size() == 0) return false;
    for (uint32_t c : p.cp) {
        const bool digit = c >= '0' && c <= '9';
        const bool alpha = is_upper(c) || is_lower(c);
        bool ok = false;
        if (which == "isdigit" || which == "isnumeric" || which == "isdecimal") ok = digit;
        if (which == "isalpha") ok = alpha;
        if (which == "isalnum") ok = alpha || digit;
        if (which == "isspace") ok = is_py_space(c);
        if (!ok) return false;
    }
    return true;
}

}  // namespace deltaserve::model::jinja
