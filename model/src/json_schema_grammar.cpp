#include "deltaserve/model/json_schema_grammar.h"

#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace deltaserve::model {

namespace {

using Json = nlohmann::ordered_json;  // properties keep the schema's order
using Seq = Grammar::Sequence;

const std::set<std::string, std::less<>> kAnnotations = {
    "title", "description", "default",    "examples", "$schema",
    "$id",   "$comment",    "deprecated", "readOnly", "writeOnly"};
const std::set<std::string, std::less<>> kKeywords = {
    "type",       "properties", "required", "additionalProperties",
    "items",      "minItems",   "maxItems", "enum",
    "const",      "anyOf",      "$ref",     "$defs",
    "definitions"};
const std::set<std::string, std::less<>> kTypes = {"object",  "array",   "string", "number",
                                                   "integer", "boolean", "null"};

std::string at_path(const std::string& where) { return where.empty() ? "/" : where; }

// The pointer text of a key (RFC 6901 escapes).
std::string pointer_key(const std::string& key) {
    std::string out;
    for (char c : key) {
        if (c == '~') {
            out += "~0";
        } else if (c == '/') {
            out += "~1";
        } else {
            out += c;
        }
    }
    return out;
}

bool type_matches(const Json& v, const std::string& t) {
    if (t == "object") return v.is_object();
    if (t == "array") return v.is_array();
    if (t == "string") return v.is_string();
    if (t == "boolean") return v.is_boolean();
    if (t == "null") return v.is_null();
    if (t == "integer") {
        return v.is_number_integer() ||
               (v.is_number_float() &&
                v.get<double>() == static_cast<double>(static_cast<long long>(v.get<double>())));
    }
    return v.is_number();  // number
}

class SchemaCompiler {
  public:
    SchemaCompiler(const Json& doc, const JsonSchemaLimits& limits, Grammar& g)
        : doc_(doc), limits_(limits), g_(g) {}

    Result<uint32_t> compile(const Json& s, const std::string& where, int32_t depth) {
        if (depth > limits_.max_depth) {
            return refuse("nested deeper than " + std::to_string(limits_.max_depth), where);
        }
        if (s.is_boolean()) {
            if (!s.get<bool>()) return refuse("the schema false admits no value", where);
            return any_value();
        }
        if (!s.is_object()) return refuse("a schema must be an object or a boolean", where);
        for (const auto& [k, v] : s.items()) {
            if (kAnnotations.count(k) == 0 && kKeywords.count(k) == 0) {
                return refuse("unsupported JSON Schema keyword '" + k + "'", where);
            }
        }
        if (s.contains("$ref")) return compile_ref(s, where, depth);
        if (s.contains("anyOf")) return compile_any_of(s, where, depth);
        std::vector<std::string> types;
        DS_ASSIGN_OR_RETURN(types, types_of(s, where));
        if (s.contains("const")) return compile_values({s["const"]}, types, "const", where);
        if (s.contains("enum")) {
            const Json& e = s["enum"];
            if (!e.is_array() || e.empty()) return refuse("'enum' must be a non-empty list", where);
            return compile_values(std::vector<Json>(e.begin(), e.end()), types, "enum", where);
        }
        if (types.empty()) return any_value();
        const uint32_t rule = g_.new_rule();
        for (const std::string& t : types) {
            uint32_t r = 0;
            DS_ASSIGN_OR_RETURN(r, compile_type(s, t, where, depth));
            g_.add(rule, {Grammar::ref(r)});
        }
        return rule;
    }

  private:
    static constexpr uint32_t kNone = ~uint32_t{0};

    uint32_t ws() {
        if (ws_ != kNone) return ws_;
        ws_ = g_.new_rule();
        ByteSet indent;
        indent.set(' ');
        indent.set('\t');
        const uint32_t pad = g_.repeat({g_.bytes(indent)}, 0, 20);
        g_.add(ws_, {});
        g_.add(ws_, g_.literal(" "));
        g_.add(ws_, {g_.byte('\n'), Grammar::ref(pad)});
        return ws_;
    }

    Status refuse(const std::string& why, const std::string& where) const {
        return invalid_argument("response schema: " + why + " at " + at_path(where));
    }

    Result<std::vector<std::string>> types_of(const Json& s, const std::string& where) const {
        std::vector<std::string> types;
        if (s.contains("type")) {
            const Json& t = s["type"];
            std::vector<Json> list =
                t.is_array() ? std::vector<Json>(t.begin(), t.end()) : std::vector<Json>{t};
            for (const Json& one : list) {
                if (!one.is_string() || kTypes.count(one.get_ref<const std::string&>()) == 0) {
                    return refuse(
                        "'type' must name object, array, string, number, integer, "
                        "boolean or null",
                        where);
                }
                types.push_back(one.get<std::string>());
            }
            if (types.empty()) return refuse("'type' lists no type", where);
            return types;
        }
        if (s.contains("properties") || s.contains("required") ||
            s.contains("additionalProperties")) {
            types.push_back("object");
        }
        if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
            types.push_back("array");
        }
        return types;
    }

    // No keyword but annotations and definitions beside `keyword`.
    Status alone(const Json& s, const char* keyword, const std::string& where) const {
        for (const auto& [k, v] : s.items()) {
            if (k == keyword || kAnnotations.count(k) != 0 || k == "$defs" || k == "definitions")
                continue;
            return refuse(std::string("'") + keyword + "' beside '" + k + "' is not supported",
                          where);
        }
        return Status();
    }

    Result<uint32_t> compile_ref(const Json& s, const std::string& where, int32_t depth) {
        DS_RETURN_IF_ERROR(alone(s, "$ref", where));
        const Json& r = s["$ref"];
        if (!r.is_string() || r.get_ref<const std::string&>().empty() ||
            r.get_ref<const std::string&>()[0] != '#') {
            return refuse("'$ref' must point into this schema ('#...')", where);
        }
        const std::string pointer = r.get<std::string>().substr(1);
        auto known = refs_.find(pointer);
        if (known != refs_.end()) return known->second;
        const Json* target = nullptr;
        try {
            const Json::json_pointer p(pointer);
            if (doc_.contains(p)) target = &doc_.at(p);
        } catch (const Json::exception&) {
        }
        if (target == nullptr)
            return refuse("'$ref' " + r.get<std::string>() + " names nothing", where);
        const uint32_t rule = g_.new_rule();
        refs_.emplace(pointer, rule);
        uint32_t body = 0;
        DS_ASSIGN_OR_RETURN(body, compile(*target, pointer, depth + 1));
        g_.add(rule, {Grammar::ref(body)});
        return rule;
    }

    Result<uint32_t> compile_any_of(const Json& s, const std::string& where, int32_t depth) {
        DS_RETURN_IF_ERROR(alone(s, "anyOf", where));
        const Json& list = s["anyOf"];
        if (!list.is_array() || list.empty()) {
            return refuse("'anyOf' must be a non-empty list", where);
        }
        const uint32_t rule = g_.new_rule();
        for (size_t i = 0; i < list.size(); ++i) {
            uint32_t r = 0;
            DS_ASSIGN_OR_RETURN(r,
                                compile(list[i], where + "/anyOf/" + std::to_string(i), depth + 1));
            g_.add(rule, {Grammar::ref(r)});
        }
        return rule;
    }

    Result<uint32_t> compile_values(const std::vector<Json>& values,
                                    const std::vector<std::string>& types, const char* keyword,
                                    const std::string& where) {
        const uint32_t rule = g_.new_rule();
        size_t kept = 0;
        for (const Json& v : values) {
            bool ok = types.empty();
            for (const std::string& t : types) ok = ok || type_matches(v, t);
            if (!ok) continue;
            g_.add(rule, g_.literal(v.dump()));
            ++kept;
        }
        if (kept == 0) {
            return refuse(std::string("no value of '") + keyword + "' is of the schema's 'type'",
                          where);
        }
        return rule;
    }

    Result<uint32_t> compile_type(const Json& s, const std::string& t, const std::string& where,
                                  int32_t depth) {
        if (t == "object") return compile_object(s, where, depth);
        if (t == "array") return compile_array(s, where, depth);
        if (t == "string") return string_value();
        if (t == "number") return number(true);
        if (t == "integer") return number(false);
        return t == "boolean" ? literals(boolean_, {"true", "false"}) : literals(null_, {"null"});
    }

    // A rule of these texts, made once into `cached`.
    uint32_t literals(uint32_t& cached, std::initializer_list<std::string_view> texts) {
        if (cached != kNone) return cached;
        cached = g_.new_rule();
        for (std::string_view t : texts) g_.add(cached, g_.literal(t));
        return cached;
    }

    // key ws ":" ws value ws
    Seq member(Seq key, uint32_t value) {
        Seq m = std::move(key);
        m.push_back(Grammar::ref(ws()));
        m.push_back(g_.byte(':'));
        m.push_back(Grammar::ref(ws()));
        m.push_back(Grammar::ref(value));
        m.push_back(Grammar::ref(ws()));
        return m;
    }

    Seq comma() { return {g_.byte(','), Grammar::ref(ws())}; }

    Result<uint32_t> compile_object(const Json& s, const std::string& where, int32_t depth) {
        const Json empty = Json::object();
        const Json& props = s.contains("properties") ? s["properties"] : empty;
        if (!props.is_object()) return refuse("'properties' must be an object", where);
        std::set<std::string> required;
        if (s.contains("required")) {
            const Json& r = s["required"];
            if (!r.is_array()) return refuse("'required' must be a list of names", where);
            for (const Json& name : r) {
                if (!name.is_string()) return refuse("'required' must be a list of names", where);
                if (!props.contains(name.get<std::string>())) {
                    return refuse("required property '" + name.get<std::string>() +
                                      "' is not in 'properties'",
                                  where);
                }
                required.insert(name.get<std::string>());
            }
        }
        const Json& extra =
            s.contains("additionalProperties") ? s["additionalProperties"] : Json(true);
        if (!extra.is_boolean() && !extra.is_object()) {
            return refuse("'additionalProperties' must be a boolean or a schema", where);
        }
        if (props.empty()) {
            if (extra.is_boolean() && !extra.get<bool>()) {
                const uint32_t empty = g_.new_rule();
                g_.add(empty, {g_.byte('{'), Grammar::ref(ws()), g_.byte('}')});
                return empty;
            }
            // A map: string keys, values of the additionalProperties schema.
            uint32_t value = 0;
            DS_ASSIGN_OR_RETURN(value, compile(extra, where + "/additionalProperties", depth + 1));
            return map_of(value);
        }
        const uint32_t rule = g_.new_rule();
        Seq open = {g_.byte('{'), Grammar::ref(ws())};
        // first[i]: members i.. with none before them; after[i]: the same after one.
        const size_t n = props.size();
        std::vector<uint32_t> first(n + 1), after(n + 1);
        first[n] = g_.new_rule();
        after[n] = g_.new_rule();
        g_.add(first[n], {});
        g_.add(after[n], {});
        std::vector<std::pair<std::string, const Json*>> list;
        for (const auto& [k, v] : props.items()) list.push_back({k, &v});
        for (size_t i = n; i-- > 0;) {
            const std::string& key = list[i].first;
            uint32_t value = 0;
            DS_ASSIGN_OR_RETURN(
                value,
                compile(*list[i].second, where + "/properties/" + pointer_key(key), depth + 1));
            Seq m = member(g_.literal(Json(key).dump()), value);
            m.push_back(Grammar::ref(after[i + 1]));
            Seq later = comma();
            later.insert(later.end(), m.begin(), m.end());
            first[i] = g_.new_rule();
            after[i] = g_.new_rule();
            g_.add(first[i], m);
            g_.add(after[i], later);
            if (required.count(key) == 0) {
                g_.add(first[i], {Grammar::ref(first[i + 1])});
                g_.add(after[i], {Grammar::ref(after[i + 1])});
            }
        }
        open.push_back(Grammar::ref(first[0]));
        open.push_back(g_.byte('}'));
        g_.add(rule, open);
        return rule;
    }

    Result<int32_t> count_of(const Json& s, const char* keyword, int32_t fallback,
                             const std::string& where) const {
        if (!s.contains(keyword)) return fallback;
        const Json& v = s[keyword];
        if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) {
            return refuse(std::string("'") + keyword + "' must be a non-negative integer", where);
        }
        if (v.get<int64_t>() > limits_.max_items) {
            return refuse(std::string("'") + keyword + "' above " +
                              std::to_string(limits_.max_items) + " is not supported",
                          where);
        }
        return static_cast<int32_t>(v.get<int64_t>());
    }

    Result<uint32_t> compile_array(const Json& s, const std::string& where, int32_t depth) {
        int32_t min = 0, max = -1;
        DS_ASSIGN_OR_RETURN(min, count_of(s, "minItems", 0, where));
        DS_ASSIGN_OR_RETURN(max, count_of(s, "maxItems", -1, where));
        if (max >= 0 && max < min) return refuse("'maxItems' is below 'minItems'", where);
        uint32_t item = 0;
        if (s.contains("items")) {
            if (s["items"].is_array()) return refuse("'items' as a list is not supported", where);
            DS_ASSIGN_OR_RETURN(item, compile(s["items"], where + "/items", depth + 1));
        } else {
            item = any_value();
        }
        return array_of(item, min, max);
    }

    // "[" ws (item ws ("," ws item ws){min-1, max-1})? "]"
    uint32_t array_of(uint32_t item, int32_t min, int32_t max) {
        const uint32_t rule = g_.new_rule();
        const Seq open = {g_.byte('['), Grammar::ref(ws())};
        if (min == 0) {
            Seq none = open;
            none.push_back(g_.byte(']'));
            g_.add(rule, none);
        }
        if (max == 0) return rule;
        Seq more = comma();
        more.push_back(Grammar::ref(item));
        more.push_back(Grammar::ref(ws()));
        Seq some = open;
        some.push_back(Grammar::ref(item));
        some.push_back(Grammar::ref(ws()));
        some.push_back(
            Grammar::ref(g_.repeat(more, min > 0 ? min - 1 : 0, max < 0 ? -1 : max - 1)));
        some.push_back(g_.byte(']'));
        g_.add(rule, some);
        return rule;
    }

    // "{" ws (member ("," ws member)*)? "}", string keys, values of `value`.
    uint32_t map_of(uint32_t value) {
        const uint32_t rule = g_.new_rule();
        const Seq open = {g_.byte('{'), Grammar::ref(ws())};
        Seq none = open;
        none.push_back(g_.byte('}'));
        g_.add(rule, none);
        const Seq m = member({g_.byte('"'), Grammar::json_string_body()}, value);
        Seq more = comma();
        more.insert(more.end(), m.begin(), m.end());
        Seq some = open;
        some.insert(some.end(), m.begin(), m.end());
        some.push_back(Grammar::ref(g_.repeat(more, 0, -1)));
        some.push_back(g_.byte('}'));
        g_.add(rule, some);
        return rule;
    }

    uint32_t string_value() {
        if (string_ != kNone) return string_;
        string_ = g_.new_rule();
        g_.add(string_, {g_.byte('"'), Grammar::json_string_body()});
        return string_;
    }

    ByteSet digits(char lo, char hi) {
        ByteSet d;
        for (char c = lo; c <= hi; ++c) d.set(static_cast<unsigned char>(c));
        return d;
    }

    // -?(0|[1-9][0-9]{0,15}) and, for numbers, (\.[0-9]{1,16})?([eE][+-]?[0-9]{1,3})?
    uint32_t number(bool fraction) {
        uint32_t& cached = fraction ? number_ : integer_;
        if (cached != kNone) return cached;
        const GrammarElement digit = g_.bytes(digits('0', '9'));
        const uint32_t integer = g_.new_rule();
        const uint32_t sign = g_.new_rule();
        g_.add(sign, {});
        g_.add(sign, g_.literal("-"));
        g_.add(integer, {Grammar::ref(sign), g_.byte('0')});
        g_.add(integer, {Grammar::ref(sign), g_.bytes(digits('1', '9')),
                         Grammar::ref(g_.repeat({digit}, 0, 15))});
        cached = integer;
        if (!fraction) return cached;
        const uint32_t frac = g_.new_rule();
        g_.add(frac, {});
        g_.add(frac, {g_.byte('.'), Grammar::ref(g_.repeat({digit}, 1, 16))});
        ByteSet e, pm;
        e.set('e');
        e.set('E');
        pm.set('+');
        pm.set('-');
        const uint32_t exp = g_.new_rule(), exp_sign = g_.new_rule();
        g_.add(exp_sign, {});
        g_.add(exp_sign, {g_.bytes(pm)});
        g_.add(exp, {});
        g_.add(exp, {g_.bytes(e), Grammar::ref(exp_sign), Grammar::ref(g_.repeat({digit}, 1, 3))});
        cached = g_.new_rule();
        g_.add(cached, {Grammar::ref(integer), Grammar::ref(frac), Grammar::ref(exp)});
        return cached;
    }

    // Any JSON value.
    uint32_t any_value() {
        if (any_ != kNone) return any_;
        any_ = g_.new_rule();
        for (uint32_t r : {map_of(any_), array_of(any_, 0, -1), string_value(), number(true),
                           literals(boolean_, {"true", "false"}), literals(null_, {"null"})}) {
            g_.add(any_, {Grammar::ref(r)});
        }
        return any_;
    }

    const Json& doc_;
    const JsonSchemaLimits& limits_;
    Grammar& g_;
    std::map<std::string, uint32_t> refs_;
    uint32_t ws_ = kNone, string_ = kNone, number_ = kNone, integer_ = kNone, any_ = kNone,
             boolean_ = kNone, null_ = kNone;
};

}  // namespace

Result<std::shared_ptr<const Grammar>> json_schema_grammar(std::string_view schema,
                                                           const JsonSchemaLimits& limits) {
    return json_schema_grammar(schema, "", "", limits);
}

Result<std::shared_ptr<const Grammar>> json_schema_grammar(std::string_view schema,
                                                           std::string_view prefix,
                                                           std::string_view suffix,
                                                           const JsonSchemaLimits& limits) {
    if (schema.size() > limits.max_schema_bytes) {
        return invalid_argument("response schema: over " + std::to_string(limits.max_schema_bytes) +
                                " bytes");
    }
    Json doc;
    try {
        // Deeper than the limit is refused while parsing (dump() and the compiler recurse).
        const int32_t max_depth = limits.max_depth;
        doc = Json::parse(schema, [max_depth](int depth, Json::parse_event_t, Json&) {
            if (depth > max_depth) throw std::length_error("nested too deep");
            return true;
        });
    } catch (const std::length_error&) {
        return invalid_argument("response schema: nested deeper than " +
                                std::to_string(limits.max_depth) + " levels");
    } catch (const Json::exception& e) {
        return invalid_argument(std::string("response schema: not valid JSON: ") + e.what());
    }
    auto g = std::make_shared<Grammar>();
    SchemaCompiler compiler(doc, limits, *g);
    uint32_t value = 0;
    DS_ASSIGN_OR_RETURN(value, compiler.compile(doc, "", 0));
    // The value alone (between the literals): a turn ends as soon as it is whole and cannot
    // go on.
    if (prefix.empty() && suffix.empty()) {
        g->set_root(value);
    } else {
        const uint32_t root = g->new_rule();
        Grammar::Sequence seq = g->literal(prefix);
        seq.push_back(Grammar::ref(value));
        const Grammar::Sequence tail = g->literal(suffix);
        seq.insert(seq.end(), tail.begin(), tail.end());
        g->add(root, std::move(seq));
        g->set_root(root);
    }
    Status st = g->finish(limits.max_elements);
    if (!st.ok()) return invalid_argument("response schema: " + st.message());
    return std::shared_ptr<const Grammar>(std::move(g));
}

}  // namespace deltaserve::model
