// Lookup, comparison, arithmetic and iteration of Jinja values, and the methods of Python's
// str, dict and list that jinja2's immutable sandbox lets a template call.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

#include "jinja_builtins.h"
#include "jinja_format.h"
#include "jinja_strings.h"

namespace deltaserve::model::jinja {
namespace {

Status undefined_error(const Value& x) {
    return invalid_argument(x.undefined_name().empty()
                                ? std::string("a value is undefined")
                                : "'" + x.undefined_name() + "' is undefined");
}

Value missing(const Value& x, std::string_view what) {
    return Value::undefined("'" + std::string(x.type_name()) + " object' has no attribute '" +
                            std::string(what) + "'");
}

// An optional string argument: nullopt when absent or None.
Result<std::optional<std::string>> optional_string(const CallArgs& a, std::string_view name,
                                                   int position) {
    DS_ASSIGN_OR_RETURN(Value v, a.get(name, position));
    if (v.is_undefined() || v.is_none()) return std::optional<std::string>();
    if (!v.is_string()) return invalid_argument(std::string(name) + " must be a string");
    return std::optional<std::string>(v.str());
}

Result<int64_t> optional_int(const CallArgs& a, std::string_view name, int position,
                             int64_t fallback) {
    DS_ASSIGN_OR_RETURN(Value v, a.get(name, position));
    if (v.is_undefined()) return fallback;
    if (!v.is_integer()) return invalid_argument(std::string(name) + " must be an integer");
    return v.as_int();
}

// str.startswith / endswith: a prefix or a tuple (list) of them.
Result<Value> affix(const Value& self, CallArgs& a, bool start) {
    DS_RETURN_IF_ERROR(a.check(start ? "startswith" : "endswith", 1, {}));
    DS_ASSIGN_OR_RETURN(Value p, a.get("prefix", 0));
    std::vector<std::string> options;
    if (p.is_string()) {
        options.push_back(p.str());
    } else if (p.is_list()) {
        for (const Value& e : p.items()) {
            if (!e.is_string()) return invalid_argument("startswith/endswith takes strings");
            options.push_back(e.str());
        }
    } else {
        return invalid_argument("startswith/endswith takes a string or a tuple of strings");
    }
    const std::string& s = self.str();
    for (const std::string& o : options) {
        if (start ? s.compare(0, o.size(), o) == 0 && s.size() >= o.size()
                  : s.size() >= o.size() && s.compare(s.size() - o.size(), o.size(), o) == 0) {
            return Value::boolean(true);
        }
    }
    return Value::boolean(false);
}

// str.format with "{}", "{0}" and "{name}" fields and "{{" / "}}"; conversions and format
// specs are refused by name.
Result<Value> format(const Value& self, const CallArgs& a) {
    const std::string& s = self.str();
    JinjaText out;
    size_t auto_index = 0;
    std::string literal;
    const auto flush = [&] {
        if (self.contains_input()) {
            out.append_input(literal);
        } else {
            out.append_literal(literal);
        }
        literal.clear();
    };
    for (size_t i = 0; i < s.size(); ++i) {
        const char c = s[i];
        if ((c == '{' || c == '}') && i + 1 < s.size() && s[i + 1] == c) {
            literal += c;
            ++i;
            continue;
        }
        if (c == '}') return invalid_argument("format: single '}' encountered in format string");
        if (c != '{') {
            literal += c;
            continue;
        }
        const size_t end = s.find('}', i);
        if (end == std::string::npos) return invalid_argument("format: a '{' without '}'");
        const std::string field = s.substr(i + 1, end - i - 1);
        if (field.find_first_of(":!.[") != std::string::npos) {
            return invalid_argument("format: the field '{" + field +
                                    "}' (conversions, specs, attributes) is not supported");
        }
        Value v;
        if (field.empty() || std::isdigit(static_cast<unsigned char>(field[0]))) {
            size_t k = 0;
            if (field.empty()) {
                k = auto_index++;
            } else {
                for (char d : field) {
                    if (!std::isdigit(static_cast<unsigned char>(d)) || k > 1'000'000) {
                        return invalid_argument("format: the field '{" + field + "}'");
                    }
                    k = k * 10 + static_cast<size_t>(d - '0');
                }
            }
            if (k >= a.args.size()) {
                return invalid_argument("format: replacement index " + std::to_string(k) +
                                        " out of range");
            }
            v = a.args[k];
        } else {
            const Value* found = nullptr;
            for (const auto& [name, value] : a.kwargs) {
                if (name == field) found = &value;
            }
            if (found == nullptr) return invalid_argument("format: no argument '" + field + "'");
            v = *found;
        }
        flush();
        out.append(to_text(v));
        i = end;
    }
    flush();
    return Value::string(std::move(out));
}

Result<Value> string_method(const Value& self, std::string_view m, CallArgs& a) {
    const std::string& s = self.str();
    if (m == "strip" || m == "lstrip" || m == "rstrip") {
        DS_RETURN_IF_ERROR(a.check(m, 1, {"chars"}));
        DS_ASSIGN_OR_RETURN(auto chars, optional_string(a, "chars", 0));
        return derived(self, strip(s, chars, m != "rstrip", m != "lstrip"));
    }
    if (m == "split" || m == "rsplit") {
        DS_RETURN_IF_ERROR(a.check(m, 2, {"sep", "maxsplit"}));
        DS_ASSIGN_OR_RETURN(auto sep, optional_string(a, "sep", 0));
        DS_ASSIGN_OR_RETURN(int64_t maxsplit, optional_int(a, "maxsplit", 1, -1));
        if (sep && sep->empty()) return invalid_argument("split: empty separator");
        ValueList parts;
        for (std::string& p : split(s, sep, maxsplit, m == "rsplit")) {
            parts.push_back(derived(self, std::move(p)));
        }
        return Value::list(std::move(parts));
    }
    if (m == "startswith" || m == "endswith") return affix(self, a, m == "startswith");
    if (m == "upper" || m == "lower" || m == "title" || m == "capitalize" || m == "swapcase") {
        DS_RETURN_IF_ERROR(a.check(m, 0, {}));
        return derived(self, change_case(s, m));
    }
    if (m == "replace") {
        DS_RETURN_IF_ERROR(a.check(m, 3, {}));
        if (a.args.size() < 2 || !a.args[0].is_string() || !a.args[1].is_string()) {
            return invalid_argument("replace takes two strings");
        }
        DS_ASSIGN_OR_RETURN(int64_t count, optional_int(a, "count", 2, -1));
        const bool input = self.contains_input() || a.args[1].contains_input();
        std::string r = replace(s, a.args[0].str(), a.args[1].str(), count);
        return input ? Value::input(std::move(r)) : Value::literal(std::move(r));
    }
    if (m == "find" || m == "rfind" || m == "count" || m == "index" || m == "rindex") {
        DS_RETURN_IF_ERROR(a.check(m, 1, {}));
        if (a.args.size() != 1 || !a.args[0].is_string()) {
            return invalid_argument(std::string(m) + " takes one string");
        }
        const std::string& sub = a.args[0].str();
        if (m == "count") return Value::integer(count_of(s, sub));
        const size_t at = (m == "find" || m == "index") ? s.find(sub) : s.rfind(sub);
        if (at == std::string::npos) {
            if (m == "index" || m == "rindex") return invalid_argument("substring not found");
            return Value::integer(-1);
        }
        return Value::integer(static_cast<int64_t>(code_points(s.substr(0, at)).size() - 1));
    }
    if (m == "join") {
        DS_RETURN_IF_ERROR(a.check(m, 1, {}));
        if (a.args.size() != 1) return invalid_argument("join takes one argument");
        DS_ASSIGN_OR_RETURN(ValueList items, iterate(a.args[0]));
        JinjaText out;
        for (size_t i = 0; i < items.size(); ++i) {
            if (!items[i].is_string()) {
                return invalid_argument("join: sequence item " + std::to_string(i) +
                                        ": expected str instance, " +
                                        std::string(items[i].type_name()) + " found");
            }
            if (i > 0) out.append(self.text());
            out.append(items[i].text());
        }
        return Value::string(std::move(out));
    }
    if (m == "format") return format(self, a);
    if (m == "splitlines") {
        DS_RETURN_IF_ERROR(a.check(m, 0, {}));
        ValueList parts;
        for (std::string& p : split_lines(s)) parts.push_back(derived(self, std::move(p)));
        return Value::list(std::move(parts));
    }
    if (m == "isdigit" || m == "isalpha" || m == "isalnum" || m == "isspace" || m == "islower" ||
        m == "isupper" || m == "isnumeric" || m == "isdecimal") {
        DS_RETURN_IF_ERROR(a.check(m, 0, {}));
        return Value::boolean(char_class(s, m));
    }
    return invalid_argument("the str method '" + std::string(m) + "' is not supported");
}

Result<Value> dict_method(const Value& self, std::string_view m, CallArgs& a) {
    const Dict& d = self.entries();
    if (m == "items" || m == "keys" || m == "values") {
        DS_RETURN_IF_ERROR(a.check(m, 0, {}));
        ValueList out;
        for (const auto& [k, v] : d.entries()) {
            Value key = derived(self, k);
            if (m == "items") {
                out.push_back(Value::tuple({key, v}));
            } else {
                out.push_back(m == "keys" ? key : v);
            }
        }
        return Value::list(std::move(out));
    }
    if (m == "get") {
        DS_RETURN_IF_ERROR(a.check(m, 2, {}));
        if (a.args.empty()) return invalid_argument("get takes a key");
        DS_ASSIGN_OR_RETURN(Value fallback, a.get("default", 1));
        if (a.args[0].is_string()) {
            if (const Value* v = d.find(a.args[0].str())) return *v;
        }
        return fallback.is_undefined() ? Value::none() : fallback;
    }
    return invalid_argument("dict." + std::string(m) +
                            " is not allowed: templates cannot change a dict (jinja2's "
                            "immutable sandbox)");
}

Result<Value> list_method(const Value& self, std::string_view m, CallArgs& a) {
    if (m == "count" || m == "index") {
        DS_RETURN_IF_ERROR(a.check(m, 1, {}));
        if (a.args.size() != 1) return invalid_argument(std::string(m) + " takes one argument");
        int64_t n = 0;
        const ValueList& items = self.items();
        for (size_t i = 0; i < items.size(); ++i) {
            if (!equal(items[i], a.args[0])) continue;
            if (m == "index") return Value::integer(static_cast<int64_t>(i));
            ++n;
        }
        if (m == "index") return invalid_argument("index: the value is not in the list");
        return Value::integer(n);
    }
    return invalid_argument("list." + std::string(m) +
                            " is not allowed: templates cannot change a list (jinja2's "
                            "immutable sandbox)");
}

constexpr std::string_view kStrMethods[] = {
    "capitalize",   "count",      "endswith",   "find",       "index",      "isalnum",
    "isalpha",      "isdecimal",  "isdigit",    "islower",    "isnumeric",  "isspace",
    "isupper",      "join",       "lower",      "lstrip",     "replace",    "rfind",
    "rindex",       "rsplit",     "rstrip",     "split",      "splitlines", "startswith",
    "strip",        "swapcase",   "title",      "upper",      "casefold",   "center",
    "encode",       "expandtabs", "format",     "format_map", "isascii",    "isidentifier",
    "isprintable",  "istitle",    "ljust",      "maketrans",  "partition",  "removeprefix",
    "removesuffix", "rjust",      "rpartition", "translate",  "zfill"};
constexpr std::string_view kDictMethods[] = {"clear",      "copy",   "fromkeys", "get",
                                             "items",      "keys",   "pop",      "popitem",
                                             "setdefault", "update", "values"};
constexpr std::string_view kListMethods[] = {"append", "clear",   "copy",   "count",
                                             "extend", "index",   "insert", "pop",
                                             "remove", "reverse", "sort"};

template <size_t N>
bool listed(const std::string_view (&names)[N], std::string_view n) {
    return std::find(std::begin(names), std::end(names), n) != std::end(names);
}

Value bound(const Value& self, std::string_view name,
            Result<Value> (*method)(const Value&, std::string_view, CallArgs&)) {
    std::string n(name);
    return Value::callable(n, [self, n, method](CallArgs& a) { return method(self, n, a); });
}

Result<int64_t> index_of(const Value& key, size_t size) {
    int64_t i = key.as_int();
    if (i < 0) i += static_cast<int64_t>(size);
    return i;
}

}  // namespace

Result<Value> get_attribute(const Value& x, std::string_view name) {
    using K = Value::Kind;
    switch (x.kind()) {
        case K::kUndefined:
            return undefined_error(x);
        case K::kString:
            if (listed(kStrMethods, name)) return bound(x, name, string_method);
            return missing(x, name);
        case K::kDict:
            if (listed(kDictMethods, name)) return bound(x, name, dict_method);
            if (const Value* v = x.entries().find(name)) return *v;
            return missing(x, name);
        case K::kNamespace:
            if (const Value* v = x.entries().find(name)) return *v;
            return missing(x, name);
        case K::kList:
            if (listed(kListMethods, name)) return bound(x, name, list_method);
            return missing(x, name);
        default:
            return missing(x, name);
    }
}

Result<Value> get_item(const Value& x, const Value& key) {
    using K = Value::Kind;
    if (x.is_undefined()) return undefined_error(x);
    if (x.is_generator()) {
        return invalid_argument("'" + std::string(x.type_name()) + "' object is not subscriptable");
    }
    if (x.kind() == K::kList && key.is_integer()) {
        DS_ASSIGN_OR_RETURN(int64_t i, index_of(key, x.items().size()));
        if (i >= 0 && i < static_cast<int64_t>(x.items().size())) {
            return x.items()[static_cast<size_t>(i)];
        }
        return Value::undefined("list index out of range");
    }
    if (x.kind() == K::kString && key.is_integer()) {
        const std::vector<size_t> at = code_points(x.str());
        DS_ASSIGN_OR_RETURN(int64_t i, index_of(key, at.size() - 1));
        if (i >= 0 && i + 1 < static_cast<int64_t>(at.size())) {
            const auto u = static_cast<size_t>(i);
            return derived(x, x.str().substr(at[u], at[u + 1] - at[u]));
        }
        return Value::undefined("string index out of range");
    }
    if (x.kind() == K::kDict && key.is_string()) {
        if (const Value* v = x.entries().find(key.str())) return *v;
    }
    if (key.is_string()) return get_attribute(x, key.str());
    return Value::undefined("no item " + py_repr(key));
}

Result<Value> get_slice(const Value& x, const Value& start, const Value& stop, const Value& step) {
    if (x.is_undefined()) return undefined_error(x);
    const bool is_str = x.is_string();
    if ((!is_str && !x.is_list()) || x.is_generator()) {
        return invalid_argument("'" + std::string(x.type_name()) + "' object is not subscriptable");
    }
    const std::vector<size_t> at = is_str ? code_points(x.str()) : std::vector<size_t>();
    const int64_t n =
        is_str ? static_cast<int64_t>(at.size() - 1) : static_cast<int64_t>(x.items().size());
    for (const Value* v : {&start, &stop, &step}) {
        if (!v->is_undefined() && !v->is_none() && !v->is_integer()) {
            return invalid_argument("slice indices must be integers or None");
        }
    }
    const int64_t st = step.is_integer() ? step.as_int() : 1;
    if (st == 0) return invalid_argument("slice step cannot be zero");
    // Python's PySlice_AdjustIndices.
    const auto adjust = [&](const Value& v, int64_t fallback) {
        if (!v.is_integer()) return fallback;
        int64_t i = v.as_int();
        if (i < 0) {
            i += n;
            if (i < 0) i = st < 0 ? -1 : 0;
        } else if (i >= n) {
            i = st < 0 ? n - 1 : n;
        }
        return i;
    };
    const int64_t b = adjust(start, st < 0 ? n - 1 : 0);
    const int64_t e = adjust(stop, st < 0 ? -1 : n);
    std::vector<int64_t> picks;
    for (int64_t i = b; st > 0 ? i < e : i > e; i += st) picks.push_back(i);
    if (is_str) {
        std::string out;
        for (int64_t i : picks) {
            const auto u = static_cast<size_t>(i);
            out.append(x.str(), at[u], at[u + 1] - at[u]);
        }
        return derived(x, std::move(out));
    }
    ValueList out;
    for (int64_t i : picks) out.push_back(x.items()[static_cast<size_t>(i)]);
    return Value::list(std::move(out));
}

Result<int> compare(const Value& a, const Value& b) {
    if (a.is_number() && b.is_number()) {
        if (a.is_integer() && b.is_integer()) {
            return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
        }
        return a.as_double() < b.as_double() ? -1 : a.as_double() > b.as_double() ? 1 : 0;
    }
    if (a.is_string() && b.is_string()) {
        const int c = a.str().compare(b.str());  // UTF-8 keeps code point order
        return c < 0 ? -1 : c > 0 ? 1 : 0;
    }
    if (a.is_list() && b.is_list()) {
        const ValueList &x = a.items(), &y = b.items();
        for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
            if (equal(x[i], y[i])) continue;
            return compare(x[i], y[i]);
        }
        return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
    }
    if (a.is_undefined()) return undefined_error(a);
    if (b.is_undefined()) return undefined_error(b);
    return invalid_argument("'<' not supported between instances of '" +
                            std::string(a.type_name()) + "' and '" + std::string(b.type_name()) +
                            "'");
}

Result<bool> contains(const Value& container, const Value& item) {
    using K = Value::Kind;
    switch (container.kind()) {
        case K::kString:
            if (!item.is_string()) {
                return invalid_argument("'in <string>' requires string as left operand, not " +
                                        std::string(item.type_name()));
            }
            return container.str().find(item.str()) != std::string::npos;
        case K::kList:
            for (const Value& v : container.items()) {
                if (equal(v, item)) return true;
            }
            return false;
        case K::kDict:
            return item.is_string() && container.entries().find(item.str()) != nullptr;
        case K::kUndefined:
            return false;
        default:
            return invalid_argument("argument of type '" + std::string(container.type_name()) +
                                    "' is not iterable");
    }
}

Result<ValueList> iterate(const Value& x) {
    using K = Value::Kind;
    switch (x.kind()) {
        case K::kUndefined:
            return ValueList();
        case K::kList:
            return x.items();
        case K::kDict: {
            ValueList keys;
            for (const auto& [k, v] : x.entries().entries()) keys.push_back(derived(x, k));
            return keys;
        }
        case K::kString: {
            const std::vector<size_t> at = code_points(x.str());
            ValueList chars;
            for (size_t i = 0; i + 1 < at.size(); ++i) {
                chars.push_back(derived(x, x.str().substr(at[i], at[i + 1] - at[i])));
            }
            return chars;
        }
        default:
            return invalid_argument("'" + std::string(x.type_name()) + "' object is not iterable");
    }
}

namespace {

constexpr size_t kMaxRepeat = 1 << 24;  // bytes or items a * may make

Result<Value> numeric(std::string_view op, const Value& a, const Value& b) {
    if (a.is_integer() && b.is_integer() && op != "/") {
        const int64_t x = a.as_int(), y = b.as_int();
        int64_t r = 0;
        if (op == "+" && !__builtin_add_overflow(x, y, &r)) return Value::integer(r);
        if (op == "-" && !__builtin_sub_overflow(x, y, &r)) return Value::integer(r);
        if (op == "*" && !__builtin_mul_overflow(x, y, &r)) return Value::integer(r);
        if (op == "//" || op == "%") {
            if (y == 0) return invalid_argument("integer division or modulo by zero");
            if (x == std::numeric_limits<int64_t>::min() && y == -1) {
                return invalid_argument("integer overflow in //");
            }
            int64_t q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) {
                --q;
                m += y;
            }
            return Value::integer(op == "//" ? q : m);
        }
        if (op == "**") {
            if (y < 0)
                return Value::number(std::pow(static_cast<double>(x), static_cast<double>(y)));
            int64_t acc = 1;
            for (int64_t i = 0; i < y; ++i) {
                if (__builtin_mul_overflow(acc, x, &acc)) {
                    return invalid_argument("integer overflow in **");
                }
                if (acc == 0 || acc == 1) break;
            }
            return Value::integer(acc);
        }
        return invalid_argument("integer overflow in " + std::string(op));
    }
    const double x = a.as_double(), y = b.as_double();
    if (op == "+") return Value::number(x + y);
    if (op == "-") return Value::number(x - y);
    if (op == "*") return Value::number(x * y);
    if (op == "**") return Value::number(std::pow(x, y));
    if (y == 0) return invalid_argument("float division by zero");
    if (op == "/") return Value::number(x / y);
    if (op == "//") return Value::number(std::floor(x / y));
    double m = std::fmod(x, y);
    if (m != 0 && ((m < 0) != (y < 0))) m += y;
    return Value::number(m);
}

Result<Value> repeat(const Value& seq, int64_t times) {
    if (times < 0) times = 0;
    const size_t unit = seq.is_string() ? seq.str().size() : seq.items().size();
    if (unit != 0 && static_cast<size_t>(times) > kMaxRepeat / unit) {
        return invalid_argument("a repetition past 16 MiB");
    }
    if (seq.is_string()) {
        JinjaText out;
        for (int64_t i = 0; i < times; ++i) out.append(seq.text());
        return Value::string(std::move(out));
    }
    ValueList out;
    for (int64_t i = 0; i < times; ++i)
        out.insert(out.end(), seq.items().begin(), seq.items().end());
    return Value::list(std::move(out));
}

}  // namespace

Result<Value> arithmetic(std::string_view op, const Value& a, const Value& b) {
    if (op == "~") {
        JinjaText t = to_text(a);
        t.append(to_text(b));
        return Value::string(std::move(t));
    }
    if (a.is_undefined()) return undefined_error(a);
    if (b.is_undefined()) return undefined_error(b);
    if (a.is_number() && b.is_number()) return numeric(op, a, b);
    if (op == "+" && a.is_string() && b.is_string()) {
        if (a.is_markup() || b.is_markup()) {  // Markup escapes the plain side
            const auto side = [](const Value& v) {
                return v.is_markup() ? v.text() : derived(v, html_escape(v.str())).text();
            };
            JinjaText t = side(a);
            t.append(side(b));
            return Value::markup(std::move(t));
        }
        JinjaText t = a.text();
        t.append(b.text());
        return Value::string(std::move(t));
    }
    if (op == "+" && a.is_list() && b.is_list() && !a.is_generator() && !b.is_generator()) {
        ValueList out = a.items();
        out.insert(out.end(), b.items().begin(), b.items().end());
        return Value::list(std::move(out));
    }
    const auto repeatable = [](const Value& v) {
        return v.is_string() || (v.is_list() && !v.is_generator());
    };
    if (op == "*" && repeatable(a) && b.is_integer()) return repeat(a, b.as_int());
    if (op == "*" && repeatable(b) && a.is_integer()) return repeat(b, a.as_int());
    if (op == "%" && a.is_string()) {
        return invalid_argument("string formatting with '%' is not supported");
    }
    return invalid_argument("unsupported operand type(s) for " + std::string(op) + ": '" +
                            std::string(a.type_name()) + "' and '" + std::string(b.type_name()) +
                            "'");
}

}  // namespace deltaserve::model::jinja
