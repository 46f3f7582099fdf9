// jinja2's built-in filters and tests (filters.py, tests.py), with transformers' tojson
// (json.dumps with ensure_ascii=False) in place of jinja2's HTML-safe one.
#include <algorithm>
#include <cmath>

#include "jinja_builtins.h"
#include "jinja_format.h"
#include "jinja_strings.h"

namespace deltaserve::model::jinja {
namespace {

using FilterFn = Result<Value> (*)(const Value&, CallArgs&);

Result<Value> arg(const CallArgs& a, std::string_view name, int position) {
    return a.get(name, position);
}

Result<Value> f_default(const Value& x, CallArgs& a) {
    DS_RETURN_IF_ERROR(a.check("default", 2, {"default_value", "boolean"}));
    DS_ASSIGN_OR_RETURN(Value fallback, arg(a, "default_value", 0));
    DS_ASSIGN_OR_RETURN(Value boolean, arg(a, "boolean", 1));
    if (x.is_undefined() || (boolean.truthy() && !x.truthy())) {
        return fallback.is_undefined() ? Value::literal("") : fallback;
    }
    return x;
}

Result<Value> f_length(const Value& x, CallArgs& a) {
    DS_RETURN_IF_ERROR(a.check("length", 0, {}));
    switch (x.kind()) {
        case Value::Kind::kString:
            return Value::integer(static_cast<int64_t>(code_points(x.str()).size() - 1));
        case Value::Kind::kList:
            if (x.is_generator()) break;
            return Value::integer(static_cast<int64_t>(x.items().size()));
        case Value::Kind::kDict:
            return Value::integer(static_cast<int64_t>(x.entries().size()));
        case Value::Kind::kUndefined:
            return Value::integer(0);
        default:
            break;
    }
    return invalid_argument("length: object of type '" + std::string(x.type_name()) +
                            "' has no len()");
}

Result<Value> f_tojson(const Value& x, CallArgs& a) {
    DS_RETURN_IF_ERROR(a.check("tojson", 5, {"ensure_ascii", "indent", "separators", "sort_keys"}));
    JsonOptions o;
    DS_ASSIGN_OR_RETURN(Value ascii, arg(a, "ensure_ascii", 0));
    DS_ASSIGN_OR_RETURN(Value indent, arg(a, "indent", 1));
    DS_ASSIGN_OR_RETURN(Value seps, arg(a, "separators", 2));
    DS_ASSIGN_OR_RETURN(Value sort, arg(a, "sort_keys", 3));
    o.ensure_ascii = ascii.truthy();
    o.sort_keys = sort.truthy();
    if (indent.is_integer()) {
        o.indent = static_cast<int>(std::clamp<int64_t>(indent.as_int(), 0, 64));
    } else if (indent.is_string()) {
        o.indent_text = indent.str();
        o.has_indent_text = true;
    } else if (!indent.is_undefined() && !indent.is_none()) {
        return invalid_argument("tojson: indent must be an integer or a string");
    }
    if (seps.is_list()) {
        if (seps.items().size() != 2 || !seps.items()[0].is_string() ||
            !seps.items()[1].is_string()) {
            return invalid_argument("tojson: separators must be two strings");
        }
        o.has_separators = true;
        o.item_separator = seps.items()[0].str();
        o.key_separator = seps.items()[1].str();
    } else if (!seps.is_undefined() && !seps.is_none()) {
        return invalid_argument("tojson: separators must be a tuple of two strings");
    }
    DS_ASSIGN_OR_RETURN(std::string json, to_json(x, o));
    return x.contains_input() ? Value::input(std::move(json)) : Value::literal(std::move(json));
}

Result<Value> f_trim(const Value& x, CallArgs& a) {
    DS_RETURN_IF_ERROR(a.check("trim", 1, {"chars"}));
    DS_ASSIGN_OR_RETURN(Value chars, arg(a, "chars", 0));
    std::optional<std::string> c;
    if (chars.is_string()) c = chars.str();
    return derived(x, strip(py_str(x), c, true, true));
}

Result<Value> f_string(const Value& x, CallArgs& a) {
    DS_RETURN_IF_ERROR(a.check("string", 0, {}));
    return Value::string(to_text(x));
}

Result<Value> cased(const Value& x, CallArgs& a, std::string_view how) {
    DS_RETURN_IF_ERROR(a.check(how, 0, {}));
    return derived(x, change_case(py_str(x), how));
}
Result<Value> f_upper(const Value& x, CallArgs& a) { return cased(x, a, "upper"); }
Result<Value> f_lower(const Value& x, CallArgs& a) { return cased(x, a, "lower"); }
Result<Value> f_title(const Value& x, CallArgs& a) { return cased(x, a, "title"); }
Result<Value> f_capitalize(const Value& x, CallArgs& a) { return cased(x, a, "capitalize"); }

Result<Value> f_first_last(const Value& x, CallArgs& a, bool first) {
    DS_RETURN_IF_ERROR(a.check(first ? "first" : "last", 0, {}));
    DS_ASSIGN_OR_RETURN(ValueList items, iterate(x));
    if (items.empty()) return Value::undefined("No first item, sequence was empty.");
    return first ? items.front() : items.back();
}
Result<Value> f_first(const Value& x, CallArgs& a) { return f_first_last(x, a, true); }
Result<Value> f_last(const Value& x, CallArgs& a) { return f_first_last(x, a, false); }

Result<Value> f_list(const Value& x, CallArgs& a) {
    DS_RETURN_IF_ERROR(a.check("list", 0, {}));
    DS_ASSIGN_OR_RETURN(ValueList items, iterate(x));
    return Value::list(std::move(items));
}

Result<Value> f_reverse(const Value& x, CallArgs& a) {
    DS_RETURN_IF_ERROR(a.check("reverse", 0, {}));
    DS_ASSIGN_OR_RETURN(ValueList items, iterate(x));
    std::reverse(items.begin(), items.end());
    if (x.is_string()) {
        std::string s;
        for (const Value& c : items) s += c.str();
        return derived(x, std::move(s));
    }
    return Value::generator(std::move(items), "list_reverseiterator");
}

Result<Value> f_join(const Value& x, CallArgs& a) {
    DS_RETURN_IF_ERROR(a.check("join", 2, {"d", "attribute"}));
    DS_ASSIGN_OR_RETURN(Value sep, arg(a, "d", 0));
    DS_ASSIGN_OR_RETURN(Value attribute, arg(a, "attribute", 1));
    DS_ASSIGN_OR_RETURN(ValueList items, iterate(x));
    JinjaText out;
    for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0 && sep.is_string()) out.append(sep.text());
        Value item = items[i];
        if (attribute.is_string()) {
            DS_ASSIGN_OR_RETURN(item, get_item(item, attribute));
        }
        out.append(to_text(item));
    }
    return Value::string(std::move(out));
}

Result<Value> f_items(const Value& x, CallArgs& a) {
    DS_RETURN_IF_ERROR(a.check("items", 0, {}));
    if (x.is_undefined()) return Value::list({});
    if (!x.is_dict()) return invalid_argument("items: can only get item pairs from a mapping");
    ValueList out;
    for (const auto& [k, v] : x.entries().entries())
        out.push_back(Value::tuple({derived(x, k), v}));
    return Value::generator(std::move(out), "generator");
}

Result<Value> f_dictsort(const Value& x, CallArgs& a) {
    DS_RETURN_IF_ERROR(a.check("dictsort", 3, {"case_sensitive", "by", "reverse"}));
    CallArgs none;
    DS_ASSIGN_OR_RETURN(Value items, f_items(x, none));
    DS_ASSIGN_OR_RETURN(Value by, arg(a, "by", 1));
    DS_ASSIGN_OR_RETURN(Value rev, arg(a, "reverse", 2));
    const size_t pos = by.is_string() && by.str() == "value" ? 1 : 0;
    ValueList v = items.items();
    Status err;
    std::stable_sort(v.begin(), v.end(), [&](const Value& l, const Value& r) {
        Result<int> c = compare(l.items()[pos], r.items()[pos]);
        if (!c.has_value()) err = c.error();
        return c.has_value() && *c < 0;
    });
    DS_RETURN_IF_ERROR(err);
    if (rev.truthy()) std::reverse(v.begin(), v.end());
    return Value::list(std::move(v));
}

Result<Value> f_replace(const Value& x, CallArgs& a) {
    DS_RETURN_IF_ERROR(a.check("replace", 3, {"old", "new", "count"}));
    DS_ASSIGN_OR_RETURN(Value old, arg(a, "old", 0));
    DS_ASSIGN_OR_RETURN(Value with, arg(a, "new", 1));
    DS_ASSIGN_OR_RETURN(Value count, arg(a, "count", 2));
    if (!old.is_string() || !with.is_string()) return invalid_argument("replace takes two strings");
    std::string r =
        replace(py_str(x), old.str(), with.str(), count.is_integer() ? count.as_int() : -1);
    return x.contains_input() || with.contains_input() ? Value::input(std::move(r))
                                                       : Value::literal(std::move(r));
}

Result<Value> f_int(const Value& x, CallArgs& a) {
    DS_RETURN_IF_ERROR(a.check("int", 2, {"default", "base"}));
    DS_ASSIGN_OR_RETURN(Value fallback, arg(a, "default", 0));
    const Value dflt = fallback.is_undefined() ? Value::integer(0) : fallback;
    if (x.is_integer()) return Value::integer(x.as_int());
    if (x.kind() == Value::Kind::kFloat) {
        if (!std::isfinite(x.as_double())) return dflt;
        return Value::integer(static_cast<int64_t>(x.as_double()));
    }
    if (x.is_string()) {
        const std::string s = strip(x.str(), std::nullopt, true, true);
        char* end = nullptr;
        errno = 0;
        const long long v = std::strtoll(s.c_str(), &end, 10);
        if (!s.empty() && end == s.c_str() + s.size() && errno == 0) return Value::integer(v);
        const double d = std::strtod(s.c_str(), &end);
        if (!s.empty() && end == s.c_str() + s.size() && std::isfinite(d)) {
            return Value::integer(static_cast<int64_t>(d));
        }
    }
    return dflt;
}

Result<Value> f_float(const Value& x, CallArgs& a) {
    DS_RETURN_IF_ERROR(a.check("float", 1, {"default"}));
    DS_ASSIGN_OR_RETURN(Value fallback, arg(a, "default", 0));
    if (x.is_number()) return Value::number(x.as_double());
    if (x.is_string()) {
        const std::string s = strip(x.str(), std::nullopt, true, true);
        char* end = nullptr;
        const double d = std::strtod(s.c_str(), &end);
        if (!s.empty() && end == s.c_str() + s.size()) return Value::number(d);
    }
    return fallback.is_undefined() ? Value::number(0.0) : fallback;
}

Result<Value> f_abs(const Value& x, CallArgs& a) {
    DS_RETURN_IF_ERROR(a.check("abs", 0, {}));
    if (x.is_integer()) {
        if (x.as_int() == INT64_MIN) return invalid_argument("abs: integer overflow");
        return Value::integer(std::abs(x.as_int()));
    }
    if (x.is_number()) return Value::number(std::fabs(x.as_double()));
    return invalid_argument("bad operand type for abs(): '" + std::string(x.type_name()) + "'");
}

Result<Value> f_round(const Value& x, CallArgs& a) {
    DS_RETURN_IF_ERROR(a.check("round", 2, {"precision", "method"}));
    DS_ASSIGN_OR_RETURN(Value precision, arg(a, "precision", 0));
    DS_ASSIGN_OR_RETURN(Value method, arg(a, "method", 1));
    if (!x.is_number()) return invalid_argument("round: not a number");
    const int64_t p = precision.is_integer() ? precision.as_int() : 0;
    const std::string m = method.is_string() ? method.str() : "common";
    const double scale = std::pow(10.0, static_cast<double>(p));
    const double v = x.as_double() * scale;
    double r;
    if (m == "common") {
        r = std::round(v);
    } else if (m == "ceil") {
        r = std::ceil(v);
    } else if (m == "floor") {
        r = std::floor(v);
    } else {
        return invalid_argument("round: method must be common, ceil or floor");
    }
    return Value::number(r / scale);
}

Result<Value> f_indent(const Value& x, CallArgs& a) {
    DS_RETURN_IF_ERROR(a.check("indent", 3, {"width", "first", "blank"}));
    DS_ASSIGN_OR_RETURN(Value width, arg(a, "width", 0));
    DS_ASSIGN_OR_RETURN(Value first, arg(a, "first", 1));
    DS_ASSIGN_OR_RETURN(Value blank, arg(a, "blank", 2));
    const std::string pad = width.is_string()
                                ? width.str()
                                : std::string(static_cast<size_t>(std::clamp<int64_t>(
                                                  width.is_integer() ? width.as_int() : 4, 0, 256)),
                                              ' ');
    std::string s = py_str(x);
    // jinja2: s += "\n"; lines = s.splitlines(); lines[0] kept; others padded (blank lines
    // only with blank=True); then the result without the added newline.
    s += "\n";
    std::vector<std::string> lines = split_lines(s);
    std::string out;
    for (size_t i = 0; i < lines.size(); ++i) {
        if (i > 0) out += "\n";
        const bool pad_it = (i > 0 || first.truthy()) && (blank.truthy() || !lines[i].empty());
        if (pad_it) out += pad;
        out += lines[i];
    }
    return derived(x, std::move(out));
}

// map / select / reject / selectattr / rejectattr.
// jinja2's lazy filters iterate nothing when given a false value ("if value: for ...").
Result<ValueList> lazy_items(const Value& x) {
    if (!x.truthy()) return ValueList();
    return iterate(x);
}

Result<Value> f_map(const Value& x, CallArgs& a) {
    DS_ASSIGN_OR_RETURN(ValueList items, lazy_items(x));
    DS_ASSIGN_OR_RETURN(Value attribute, a.get("attribute", -1));
    ValueList out;
    if (attribute.is_string()) {
        DS_ASSIGN_OR_RETURN(Value fallback, a.get("default", -1));
        for (const Value& item : items) {
            DS_ASSIGN_OR_RETURN(Value v, get_item(item, attribute));
            out.push_back(v.is_undefined() && !fallback.is_undefined() ? fallback : v);
        }
        return Value::generator(std::move(out), "generator");
    }
    if (a.args.empty() || !a.args[0].is_string())
        return invalid_argument("map: a filter name or attribute=");
    const std::string name = a.args[0].str();
    CallArgs rest;
    rest.args.assign(a.args.begin() + 1, a.args.end());
    rest.kwargs = a.kwargs;
    for (const Value& item : items) {
        CallArgs each = rest;
        DS_ASSIGN_OR_RETURN(Value v, apply_filter(name, item, each));
        out.push_back(std::move(v));
    }
    return Value::generator(std::move(out), "generator");
}

Result<Value> select_impl(const Value& x, CallArgs& a, bool by_attr, bool keep) {
    DS_ASSIGN_OR_RETURN(ValueList items, lazy_items(x));
    size_t next = 0;
    Value attribute;
    if (by_attr) {
        if (a.args.empty()) return invalid_argument("selectattr / rejectattr: an attribute name");
        attribute = a.args[next++];
    }
    std::string test;
    if (next < a.args.size()) {
        if (!a.args[next].is_string()) return invalid_argument("select: the test's name");
        test = a.args[next++].str();
    }
    CallArgs rest;
    rest.args.assign(a.args.begin() + static_cast<long>(next), a.args.end());
    rest.kwargs = a.kwargs;
    ValueList out;
    for (const Value& item : items) {
        Value v = item;
        if (by_attr) {
            DS_ASSIGN_OR_RETURN(v, get_item(item, attribute));
        }
        bool pass = v.truthy();
        if (!test.empty()) {
            CallArgs each = rest;
            DS_ASSIGN_OR_RETURN(pass, apply_test(test, v, each));
        }
        if (pass == keep) out.push_back(item);
    }
    return Value::generator(std::move(out), "generator");
}
Result<Value> f_select(const Value& x, CallArgs& a) { return select_impl(x, a, false, true); }
Result<Value> f_reject(const Value& x, CallArgs& a) { return select_impl(x, a, false, false); }
Result<Value> f_selectattr(const Value& x, CallArgs& a) { return select_impl(x, a, true, true); }
Result<Value> f_rejectattr(const Value& x, CallArgs& a) { return select_impl(x, a, true, false); }

// A key for sort / unique / min / max: attribute, then jinja2's case folding of strings.
Result<Value> sort_key(const Value& item, const Value& attribute, bool case_sensitive) {
    Value v = item;
    if (attribute.is_string()) {
        DS_ASSIGN_OR_RETURN(v, get_item(item, attribute));
    }
    if (!case_sensitive && v.is_string()) return Value::literal(change_case(v.str(), "lower"));
    return v;
}

Result<Value> f_sort(const Value& x, CallArgs& a) {
    DS_RETURN_IF_ERROR(a.check("sort", 3, {"reverse", "case_sensitive", "attribute"}));
    DS_ASSIGN_OR_RETURN(Value rev, arg(a, "reverse", 0));
    DS_ASSIGN_OR_RETURN(Value cs, arg(a, "case_sensitive", 1));
    DS_ASSIGN_OR_RETURN(Value attribute, arg(a, "attribute", 2));
    DS_ASSIGN_OR_RETURN(ValueList items, iterate(x));
    std::vector<std::pair<Value, Value>> keyed;
    for (const Value& item : items) {
        DS_ASSIGN_OR_RETURN(Value k, sort_key(item, attribute, cs.truthy()));
        keyed.emplace_back(std::move(k), item);
    }
    Status err;
    const bool reverse = rev.truthy();
    std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& l, const auto& r) {
        Result<int> c = reverse ? compare(r.first, l.first) : compare(l.first, r.first);
        if (!c.has_value()) err = c.error();
        return c.has_value() && *c < 0;
    });
    DS_RETURN_IF_ERROR(err);
    ValueList out;
    for (auto& [k, v] : keyed) out.push_back(std::move(v));
    return Value::list(std::move(out));
}

Result<Value> f_unique(const Value& x, CallArgs& a) {
    DS_RETURN_IF_ERROR(a.check("unique", 2, {"case_sensitive", "attribute"}));
    DS_ASSIGN_OR_RETURN(Value cs, arg(a, "case_sensitive", 0));
    DS_ASSIGN_OR_RETURN(Value attribute, arg(a, "attribute", 1));
    DS_ASSIGN_OR_RETURN(ValueList items, iterate(x));
    ValueList out, seen;
    for (const Value& item : items) {
        DS_ASSIGN_OR_RETURN(Value k, sort_key(item, attribute, cs.truthy()));
        bool dup = false;
        for (const Value& s : seen) dup = dup || equal(s, k);
        if (dup) continue;
        seen.push_back(k);
        out.push_back(item);
    }
    return Value::generator(std::move(out), "generator");
}

Result<Value> extreme(const Value& x, CallArgs& a, bool want_max) {
    DS_RETURN_IF_ERROR(a.check(want_max ? "max" : "min", 2, {"case_sensitive", "attribute"}));
    DS_ASSIGN_OR_RETURN(Value cs, arg(a, "case_sensitive", 0));
    DS_ASSIGN_OR_RETURN(Value attribute, arg(a, "attribute", 1));
    DS_ASSIGN_OR_RETURN(ValueList items, iterate(x));
    if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
    size_t best = 0;
    DS_ASSIGN_OR_RETURN(Value best_key, sort_key(items[0], attribute, cs.truthy()));
    for (size_t i = 1; i < items.size(); ++i) {
        DS_ASSIGN_OR_RETURN(Value k, sort_key(items[i], attribute, cs.truthy()));
        DS_ASSIGN_OR_RETURN(int c, compare(k, best_key));
        if (want_max ? c > 0 : c < 0) {
            best = i;
            best_key = k;
        }
    }
    return items[best];
}
Result<Value> f_max(const Value& x, CallArgs& a) { return extreme(x, a, true); }
Result<Value> f_min(const Value& x, CallArgs& a) { return extreme(x, a, false); }

Result<Value> f_sum(const Value& x, CallArgs& a) {
    DS_RETURN_IF_ERROR(a.check("sum", 2, {"attribute", "start"}));
    DS_ASSIGN_OR_RETURN(Value attribute, arg(a, "attribute", 0));
    DS_ASSIGN_OR_RETURN(Value start, arg(a, "start", 1));
    DS_ASSIGN_OR_RETURN(ValueList items, iterate(x));
    Value total = start.is_undefined() ? Value::integer(0) : start;
    for (const Value& item : items) {
        Value v = item;
        if (attribute.is_string()) {
            DS_ASSIGN_OR_RETURN(v, get_item(item, attribute));
        }
        DS_ASSIGN_OR_RETURN(total, arithmetic("+", total, v));
    }
    return total;
}

Result<Value> f_count_words(const Value& x, CallArgs& a) {
    DS_RETURN_IF_ERROR(a.check("wordcount", 0, {}));
    return Value::integer(static_cast<int64_t>(split(py_str(x), std::nullopt, -1, false).size()));
}

Result<Value> f_safe(const Value& x, CallArgs& a) {
    DS_RETURN_IF_ERROR(a.check("safe", 0, {}));
    return Value::markup(to_text(x));
}

Result<Value> f_escape(const Value& x, CallArgs& a) {
    DS_RETURN_IF_ERROR(a.check("escape", 0, {}));
    if (x.is_markup()) return x;
    return Value::markup(derived(x, html_escape(py_str(x))).text());
}

Result<Value> f_attr(const Value& x, CallArgs& a) {
    DS_RETURN_IF_ERROR(a.check("attr", 1, {}));
    if (a.args.size() != 1 || !a.args[0].is_string()) return invalid_argument("attr takes a name");
    return get_attribute(x, a.args[0].str());
}

struct NamedFilter {
    std::string_view name;
    FilterFn fn;
};

constexpr NamedFilter kFilters[] = {
    {"abs", f_abs},           {"attr", f_attr},       {"capitalize", f_capitalize},
    {"count", f_length},      {"d", f_default},       {"default", f_default},
    {"dictsort", f_dictsort}, {"e", f_escape},        {"escape", f_escape},
    {"first", f_first},       {"float", f_float},     {"indent", f_indent},
    {"int", f_int},           {"items", f_items},     {"join", f_join},
    {"last", f_last},         {"length", f_length},   {"list", f_list},
    {"lower", f_lower},       {"map", f_map},         {"max", f_max},
    {"min", f_min},           {"reject", f_reject},   {"rejectattr", f_rejectattr},
    {"replace", f_replace},   {"reverse", f_reverse}, {"round", f_round},
    {"safe", f_safe},         {"select", f_select},   {"selectattr", f_selectattr},
    {"sort", f_sort},         {"string", f_string},   {"sum", f_sum},
    {"title", f_title},       {"tojson", f_tojson},   {"trim", f_trim},
    {"unique", f_unique},     {"upper", f_upper},     {"wordcount", f_count_words},
};

// ---- tests ----

using TestFn = Result<bool> (*)(const Value&, CallArgs&);

Result<Value> one_arg(const CallArgs& a, std::string_view test) {
    if (a.args.size() != 1 || !a.kwargs.empty()) {
        return invalid_argument("the test '" + std::string(test) + "' takes one argument");
    }
    return a.args[0];
}

Result<bool> t_defined(const Value& x, CallArgs&) { return !x.is_undefined(); }
Result<bool> t_undefined(const Value& x, CallArgs&) { return x.is_undefined(); }
Result<bool> t_none(const Value& x, CallArgs&) { return x.is_none(); }
Result<bool> t_true(const Value& x, CallArgs&) {
    return x.kind() == Value::Kind::kBool && x.as_bool();
}
Result<bool> t_false(const Value& x, CallArgs&) {
    return x.kind() == Value::Kind::kBool && !x.as_bool();
}
Result<bool> t_boolean(const Value& x, CallArgs&) { return x.kind() == Value::Kind::kBool; }
Result<bool> t_string(const Value& x, CallArgs&) { return x.is_string(); }
Result<bool> t_number(const Value& x, CallArgs&) { return x.is_number(); }
Result<bool> t_integer(const Value& x, CallArgs&) { return x.kind() == Value::Kind::kInt; }
Result<bool> t_float(const Value& x, CallArgs&) { return x.kind() == Value::Kind::kFloat; }
Result<bool> t_mapping(const Value& x, CallArgs&) { return x.is_dict(); }
Result<bool> t_iterable(const Value& x, CallArgs&) {
    return x.is_string() || x.is_list() || x.is_dict() || x.is_undefined();
}
Result<bool> t_sequence(const Value& x, CallArgs&) {
    return x.is_string() || (x.is_list() && !x.is_generator()) || x.is_dict() || x.is_undefined();
}
Result<bool> t_callable(const Value& x, CallArgs&) { return x.kind() == Value::Kind::kCallable; }
Result<bool> t_escaped(const Value&, CallArgs&) { return false; }
Result<bool> t_lower(const Value& x, CallArgs&) { return char_class(py_str(x), "islower"); }
Result<bool> t_upper(const Value& x, CallArgs&) { return char_class(py_str(x), "isupper"); }
Result<bool> t_odd(const Value& x, CallArgs&) {
    if (!x.is_integer()) return invalid_argument("the test 'odd' takes an integer");
    return x.as_int() % 2 != 0;
}
Result<bool> t_even(const Value& x, CallArgs&) {
    if (!x.is_integer()) return invalid_argument("the test 'even' takes an integer");
    return x.as_int() % 2 == 0;
}
Result<bool> t_divisibleby(const Value& x, CallArgs& a) {
    DS_ASSIGN_OR_RETURN(Value n, one_arg(a, "divisibleby"));
    if (!x.is_integer() || !n.is_integer() || n.as_int() == 0) {
        return invalid_argument("divisibleby takes nonzero integers");
    }
    return x.as_int() % n.as_int() == 0;
}
Result<bool> t_eq(const Value& x, CallArgs& a) {
    DS_ASSIGN_OR_RETURN(Value y, one_arg(a, "eq"));
    return equal(x, y);
}
Result<bool> t_ne(const Value& x, CallArgs& a) {
    DS_ASSIGN_OR_RETURN(Value y, one_arg(a, "ne"));
    return !equal(x, y);
}
Result<bool> ordered(const Value& x, CallArgs& a, int want_sign, bool or_equal) {
    DS_ASSIGN_OR_RETURN(Value y, one_arg(a, "comparison"));
    DS_ASSIGN_OR_RETURN(int c, compare(x, y));
    return c == want_sign || (or_equal && c == 0);
}
Result<bool> t_lt(const Value& x, CallArgs& a) { return ordered(x, a, -1, false); }
Result<bool> t_le(const Value& x, CallArgs& a) { return ordered(x, a, -1, true); }
Result<bool> t_gt(const Value& x, CallArgs& a) { return ordered(x, a, 1, false); }
Result<bool> t_ge(const Value& x, CallArgs& a) { return ordered(x, a, 1, true); }
Result<bool> t_in(const Value& x, CallArgs& a) {
    DS_ASSIGN_OR_RETURN(Value seq, one_arg(a, "in"));
    return contains(seq, x);
}
Result<bool> t_sameas(const Value& x, CallArgs& a) {
    DS_ASSIGN_OR_RETURN(Value y, one_arg(a, "sameas"));
    // Python's `is`: None, True and False are singletons; other values here are the same
    // object only when equal and shared, which templates do not rely on.
    if (x.kind() != y.kind()) return false;
    if (x.is_none() || x.is_undefined()) return true;
    if (x.kind() == Value::Kind::kBool) return x.as_bool() == y.as_bool();
    return equal(x, y);
}

struct NamedTest {
    std::string_view name;
    TestFn fn;
};

constexpr NamedTest kTests[] = {
    {"boolean", t_boolean},
    {"callable", t_callable},
    {"defined", t_defined},
    {"divisibleby", t_divisibleby},
    {"eq", t_eq},
    {"equalto", t_eq},
    {"==", t_eq},
    {"escaped", t_escaped},
    {"even", t_even},
    {"false", t_false},
    {"float", t_float},
    {"ge", t_ge},
    {">=", t_ge},
    {"gt", t_gt},
    {"greaterthan", t_gt},
    {">", t_gt},
    {"in", t_in},
    {"integer", t_integer},
    {"iterable", t_iterable},
    {"le", t_le},
    {"<=", t_le},
    {"lower", t_lower},
    {"lt", t_lt},
    {"lessthan", t_lt},
    {"<", t_lt},
    {"mapping", t_mapping},
    {"ne", t_ne},
    {"!=", t_ne},
    {"none", t_none},
    {"number", t_number},
    {"odd", t_odd},
    {"sameas", t_sameas},
    {"sequence", t_sequence},
    {"string", t_string},
    {"true", t_true},
    {"undefined", t_undefined},
    {"upper", t_upper},
};

}  // namespace

bool has_filter(std::string_view name) {
    for (const auto& f : kFilters) {
        if (f.name == name) return true;
    }
    return false;
}

bool has_test(std::string_view name) {
    for (const auto& t : kTests) {
        if (t.name == name) return true;
    }
    return false;
}

Result<Value> apply_filter(std::string_view name, const Value& x, CallArgs& args) {
    for (const auto& f : kFilters) {
        if (f.name != name) continue;
        Result<Value> r = f.fn(x, args);
        if (!r.has_value()) return r.error().with_context("filter '" + std::string(name) + "'");
        return r;
    }
    return invalid_argument("no filter named '" + std::string(name) + "'");
}

Result<bool> apply_test(std::string_view name, const Value& x, CallArgs& args) {
    for (const auto& t : kTests) {
        if (t.name == name) return t.fn(x, args);
    }
    return invalid_argument("no test named '" + std::string(name) + "'");
}

}  // namespace deltaserve::model::jinja
