// Python's printing of values: str, repr, json.dumps.
#include "jinja_format.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace deltaserve::model::jinja {

std::string float_repr(double d) {
    if (std::isnan(d)) return "nan";
    if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
    char buf[64];
    // The shortest digits that round-trip, as Python's repr chooses them.
    auto [end, ec] = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
    std::string sci(buf, end);
    const bool neg = sci[0] == '-';
    if (neg) sci.erase(0, 1);
    const size_t e_at = sci.find('e');
    std::string digits = sci.substr(0, e_at);
    digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
    const int exp = std::atoi(sci.c_str() + e_at + 1);
    const int decpt = exp + 1;  // digits d1 d2 ... mean 0.d1d2... x 10^decpt
    std::string out = neg ? "-" : "";
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            out += "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
        } else if (static_cast<size_t>(decpt) >= digits.size()) {
            out += digits + std::string(static_cast<size_t>(decpt) - digits.size(), '0') + ".0";
        } else {
            out += digits.substr(0, static_cast<size_t>(decpt)) + "." +
                   digits.substr(static_cast<size_t>(decpt));
        }
        return out;
    }
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return out + e;
}

std::vector<size_t> code_points(std::string_view s) {
    std::vector<size_t> at;
    at.reserve(s.size() + 1);
    size_t i = 0;
    while (i < s.size()) {
        at.push_back(i);
        const auto c = static_cast<unsigned char>(s[i]);
        size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
        if (i + n > s.size()) n = 1;
        for (size_t k = 1; k < n; ++k) {
            if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) n = 1;
        }
        i += n;
    }
    at.push_back(s.size());
    return at;
}

uint32_t decode_code_point(std::string_view s, size_t at) {
    const auto c = static_cast<unsigned char>(s[at]);
    const auto cont = [&](size_t k) {
        return at + k < s.size()
                   ? static_cast<uint32_t>(static_cast<unsigned char>(s[at + k]) & 0x3F)
                   : 0u;
    };
    if (c < 0x80) return c;
    if ((c >> 5) == 6) return ((c & 0x1Fu) << 6) | cont(1);
    if ((c >> 4) == 14) return ((c & 0x0Fu) << 12) | (cont(1) << 6) | cont(2);
    if ((c >> 3) == 30) return ((c & 0x07u) << 18) | (cont(1) << 12) | (cont(2) << 6) | cont(3);
    return c;
}

bool is_py_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

namespace {

std::string string_repr(std::string_view s) {
    const bool has_single = s.find('\'') != std::string_view::npos;
    const bool has_double = s.find('"') != std::string_view::npos;
    const char q = has_single && !has_double ? '"' : '\'';
    std::string out(1, q);
    const std::vector<size_t> at = code_points(s);
    for (size_t i = 0; i + 1 < at.size(); ++i) {
        const uint32_t cp = decode_code_point(s, at[i]);
        char buf[16];
        if (cp == static_cast<uint32_t>(q) || cp == '\\') {
            out += '\\';
            out += static_cast<char>(cp);
        } else if (cp == '\n') {
            out += "\\n";
        } else if (cp == '\r') {
            out += "\\r";
        } else if (cp == '\t') {
            out += "\\t";
        } else if (cp < 0x20 || (cp >= 0x7F && cp < 0xA0)) {
            std::snprintf(buf, sizeof buf, "\\x%02x", cp);
            out += buf;
        } else {
            out.append(s.substr(at[i], at[i + 1] - at[i]));
        }
    }
    out += q;
    return out;
}

std::string container_repr(const Value& v) {
    std::string out;
    if (v.is_list()) {
        out = v.is_tuple() ? "(" : "[";
        bool first = true;
        for (const Value& e : v.items()) {
            if (!first) out += ", ";
            first = false;
            out += py_repr(e);
        }
        if (v.is_tuple()) return out + (v.items().size() == 1 ? ",)" : ")");
        return out + "]";
    }
    out = "{";
    bool first = true;
    for (const auto& [k, e] : v.entries().entries()) {
        if (!first) out += ", ";
        first = false;
        out += string_repr(k) + ": " + py_repr(e);
    }
    return out + "}";
}

}  // namespace

std::string py_repr(const Value& v) {
    using K = Value::Kind;
    if (v.is_generator()) return "<" + std::string(v.type_name()) + " object>";
    switch (v.kind()) {
        case K::kUndefined:
            return "Undefined";
        case K::kNone:
            return "None";
        case K::kBool:
            return v.as_bool() ? "True" : "False";
        case K::kInt:
            return std::to_string(v.as_int());
        case K::kFloat:
            return float_repr(v.as_double());
        case K::kString:
            return v.is_markup() ? "Markup(" + string_repr(v.str()) + ")" : string_repr(v.str());
        case K::kList:
        case K::kDict:
            return container_repr(v);
        case K::kNamespace:
            return "<Namespace " + container_repr(Value::dict(v.entries())) + ">";
        case K::kCallable:
            return "<function " + v.callable_name() + ">";
    }
    return "";
}

std::string py_str(const Value& v) {
    if (v.is_undefined()) return "";
    if (v.is_string()) return v.str();
    return py_repr(v);
}

JinjaText to_text(const Value& v) {
    if (v.is_string()) return v.text();
    JinjaText t;
    if (v.contains_input()) {
        t.append_input(py_str(v));
    } else {
        t.append_literal(py_str(v));
    }
    return t;
}

Value derived(const Value& src, std::string s) {
    Value v = src.contains_input() ? Value::input(std::move(s)) : Value::literal(std::move(s));
    return src.is_markup() ? Value::markup(v.text()) : v;
}

std::string html_escape(std::string_view s) {
    std::string out;
    for (char c : s) {
        switch (c) {
            case '&':
                out += "&amp;";
                break;
            case '<':
                out += "&lt;";
                break;
            case '>':
                out += "&gt;";
                break;
            case '"':
                out += "&#34;";
                break;
            case '\'':
                out += "&#39;";
                break;
            default:
                out += c;
        }
    }
    return out;
}

namespace {

void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
    out += '"';
    const std::vector<size_t> at = code_points(s);
    for (size_t i = 0; i + 1 < at.size(); ++i) {
        const uint32_t cp = decode_code_point(s, at[i]);
        char buf[16];
        switch (cp) {
            case '"':
                out += "\\\"";
                continue;
            case '\\':
                out += "\\\\";
                continue;
            case '\n':
                out += "\\n";
                continue;
            case '\r':
                out += "\\r";
                continue;
            case '\t':
                out += "\\t";
                continue;
            case '\b':
                out += "\\b";
                continue;
            case '\f':
                out += "\\f";
                continue;
            default:
                break;
        }
        if (cp < 0x20 || (ensure_ascii && cp > 0x7E)) {
            if (cp >= 0x10000) {
                const uint32_t u = cp - 0x10000;
                std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (u >> 10),
                              0xDC00 + (u & 0x3FF));
            } else {
                std::snprintf(buf, sizeof buf, "\\u%04x", cp);
            }
            out += buf;
        } else {
            out.append(s.substr(at[i], at[i + 1] - at[i]));
        }
    }
    out += '"';
}

struct JsonWriter {
    const JsonOptions& o;
    std::string indent_unit;
    bool indented;
    std::string item_sep, key_sep;
    std::string out;

    explicit JsonWriter(const JsonOptions& opts) : o(opts) {
        indented = o.has_indent_text || o.indent >= 0;
        indent_unit = o.has_indent_text
                          ? o.indent_text
                          : std::string(o.indent >= 0 ? static_cast<size_t>(o.indent) : 0, ' ');
        if (o.has_separators) {
            item_sep = o.item_separator;
            key_sep = o.key_separator;
        } else {
            item_sep = indented ? "," : ", ";
            key_sep = ": ";
        }
    }

    void newline(int level) {
        out += '\n';
        for (int i = 0; i < level; ++i) out += indent_unit;
    }

    Status write(const Value& v, int level) {
        if (level > 128) return invalid_argument("tojson: a value nested deeper than 128 levels");
        if (v.is_generator()) {
            return invalid_argument("tojson: Object of type " + std::string(v.type_name()) +
                                    " is not JSON serializable");
        }
        using K = Value::Kind;
        switch (v.kind()) {
            case K::kNone:
                out += "null";
                return Status::ok_status();
            case K::kBool:
                out += v.as_bool() ? "true" : "false";
                return Status::ok_status();
            case K::kInt:
                out += std::to_string(v.as_int());
                return Status::ok_status();
            case K::kFloat: {
                const double d = v.as_double();
                out += std::isnan(d)   ? "NaN"
                       : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                                       : float_repr(d);
                return Status::ok_status();
            }
            case K::kString:
                json_string(out, v.str(), o.ensure_ascii);
                return Status::ok_status();
            case K::kList: {
                if (v.items().empty()) {
                    out += "[]";
                    return Status::ok_status();
                }
                out += '[';
                bool first = true;
                for (const Value& e : v.items()) {
                    if (!first) out += item_sep;
                    first = false;
                    if (indented) newline(level + 1);
                    DS_RETURN_IF_ERROR(write(e, level + 1));
                }
                if (indented) newline(level);
                out += ']';
                return Status::ok_status();
            }
            case K::kDict: {
                if (v.entries().empty()) {
                    out += "{}";
                    return Status::ok_status();
                }
                std::vector<const std::pair<std::string, Value>*> entries;
                for (const auto& e : v.entries().entries()) entries.push_back(&e);
                if (o.sort_keys) {
                    std::stable_sort(entries.begin(), entries.end(),
                                     [](auto* a, auto* b) { return a->first < b->first; });
                }
                out += '{';
                bool first = true;
                for (const auto* e : entries) {
                    if (!first) out += item_sep;
                    first = false;
                    if (indented) newline(level + 1);
                    json_string(out, e->first, o.ensure_ascii);
                    out += key_sep;
                    DS_RETURN_IF_ERROR(write(e->second, level + 1));
                }
                if (indented) newline(level);
                out += '}';
                return Status::ok_status();
            }
            default:
                return invalid_argument("tojson: Object of type " + std::string(v.type_name()) +
                                        " is not JSON serializable");
        }
    }
};

}  // namespace

Result<std::string> to_json(const Value& v, const JsonOptions& o) {
    JsonWriter w(o);
    DS_RETURN_IF_ERROR(w.write(v, 0));
    return std::move(w.out);
}

}  // namespace deltaserve::model::jinja
