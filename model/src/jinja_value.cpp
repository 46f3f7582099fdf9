// Jinja values: construction, truthiness, equality, and JSON input.
#include "deltaserve/model/jinja_value.h"

#include <nlohmann/json.hpp>

namespace deltaserve::model::jinja {

void JinjaText::append(const JinjaText& other) {
    const size_t base = text.size();
    text += other.text;
    for (const auto& [b, e] : other.input) {
        if (!input.empty() && input.back().second == base + b) {
            input.back().second = base + e;
        } else {
            input.emplace_back(base + b, base + e);
        }
    }
}

void JinjaText::append_input(std::string_view s) {
    if (s.empty()) return;
    const size_t base = text.size();
    text.append(s);
    if (!input.empty() && input.back().second == base) {
        input.back().second = text.size();
    } else {
        input.emplace_back(base, text.size());
    }
}

Value Value::undefined(std::string name) {
    Value v;
    v.name_ = std::move(name);
    return v;
}

Value Value::none() {
    Value v;
    v.kind_ = Kind::kNone;
    return v;
}

Value Value::boolean(bool b) {
    Value v;
    v.kind_ = Kind::kBool;
    v.b_ = b;
    return v;
}

Value Value::integer(int64_t i) {
    Value v;
    v.kind_ = Kind::kInt;
    v.i_ = i;
    return v;
}

Value Value::number(double d) {
    Value v;
    v.kind_ = Kind::kFloat;
    v.f_ = d;
    return v;
}

Value Value::literal(std::string s) { return string(JinjaText{std::move(s), {}}); }

Value Value::input(std::string s) {
    JinjaText t;
    t.append_input(s);
    return string(std::move(t));
}

Value Value::string(JinjaText t) {
    Value v;
    v.kind_ = Kind::kString;
    v.s_ = std::make_shared<const JinjaText>(std::move(t));
    return v;
}

Value Value::markup(JinjaText t) {
    Value v = string(std::move(t));
    v.markup_ = true;
    return v;
}

Value Value::list(ValueList items) {
    Value v;
    v.kind_ = Kind::kList;
    v.l_ = std::make_shared<const ValueList>(std::move(items));
    return v;
}

Value Value::tuple(ValueList items) {
    Value v = list(std::move(items));
    v.tuple_ = true;
    return v;
}

Value Value::generator(ValueList items, std::string type_name) {
    Value v = list(std::move(items));
    v.generator_ = true;
    v.name_ = std::move(type_name);
    return v;
}

Value Value::dict(Dict d) {
    Value v;
    v.kind_ = Kind::kDict;
    v.d_ = std::make_shared<Dict>(std::move(d));
    return v;
}

Value Value::make_namespace(Dict d) {
    Value v = dict(std::move(d));
    v.kind_ = Kind::kNamespace;
    return v;
}

Value Value::callable(std::string name, NativeFn fn) {
    Value v;
    v.kind_ = Kind::kCallable;
    v.name_ = std::move(name);
    v.fn_ = std::make_shared<const NativeFn>(std::move(fn));
    return v;
}

bool Value::truthy() const {
    switch (kind_) {
        case Kind::kUndefined:
        case Kind::kNone:
            return false;
        case Kind::kBool:
            return b_;
        case Kind::kInt:
            return i_ != 0;
        case Kind::kFloat:
            return f_ != 0.0;
        case Kind::kString:
            return !s_->text.empty();
        case Kind::kList:
            return generator_ || !l_->empty();
        case Kind::kDict:
            return !d_->empty();
        case Kind::kNamespace:
        case Kind::kCallable:
            return true;
    }
    return false;
}

bool Value::contains_input() const {
    switch (kind_) {
        case Kind::kString:
            return s_->has_input();
        case Kind::kList:
            for (const Value& v : *l_) {
                if (v.contains_input()) return true;
            }
            return false;
        case Kind::kDict:
        case Kind::kNamespace:
            for (const auto& [k, v] : d_->entries()) {
                if (v.contains_input()) return true;
            }
            return false;
        default:
            return false;
    }
}

std::string_view Value::type_name() const {
    switch (kind_) {
        case Kind::kUndefined:
            return "Undefined";
        case Kind::kNone:
            return "NoneType";
        case Kind::kBool:
            return "bool";
        case Kind::kInt:
            return "int";
        case Kind::kFloat:
            return "float";
        case Kind::kString:
            return "str";
        case Kind::kList:
            return generator_ ? std::string_view(name_)
                   : tuple_   ? std::string_view("tuple")
                              : std::string_view("list");
        case Kind::kDict:
            return "dict";
        case Kind::kNamespace:
            return "Namespace";
        case Kind::kCallable:
            return "function";
    }
    return "?";
}

const Value* Dict::find(std::string_view key) const {
    for (const auto& [k, v] : entries_) {
        if (k == key) return &v;
    }
    return nullptr;
}

void Dict::set(std::string key, Value v) {
    for (auto& [k, old] : entries_) {
        if (k == key) {
            old = std::move(v);
            return;
        }
    }
    entries_.emplace_back(std::move(key), std::move(v));
}

Result<Value> CallArgs::get(std::string_view name, int position) const {
    const Value* by_name = nullptr;
    for (const auto& [k, v] : kwargs) {
        if (k == name) by_name = &v;
    }
    const bool by_position = position >= 0 && static_cast<size_t>(position) < args.size();
    if (by_name != nullptr && by_position) {
        return invalid_argument("got multiple values for argument '" + std::string(name) + "'");
    }
    if (by_name != nullptr) return *by_name;
    if (by_position) return args[static_cast<size_t>(position)];
    return Value::undefined(std::string(name));
}

Status CallArgs::check(std::string_view fn, size_t max_positional,
                       std::initializer_list<std::string_view> known) const {
    if (args.size() > max_positional) {
        return invalid_argument(std::string(fn) + "() takes at most " +
                                std::to_string(max_positional) + " positional arguments (" +
                                std::to_string(args.size()) + " given)");
    }
    for (const auto& [k, v] : kwargs) {
        bool ok = false;
        for (std::string_view n : known) ok = ok || n == k;
        if (!ok) {
            return invalid_argument(std::string(fn) + "() got an unexpected keyword argument '" +
                                    k + "'");
        }
    }
    return Status::ok_status();
}

bool equal(const Value& a, const Value& b) {
    using K = Value::Kind;
    if (a.is_number() && b.is_number()) {
        if (a.is_integer() && b.is_integer()) return a.as_int() == b.as_int();
        return a.as_double() == b.as_double();
    }
    if (a.kind() != b.kind()) return false;
    switch (a.kind()) {
        case K::kUndefined:
        case K::kNone:
            return true;
        case K::kString:
            return a.str() == b.str();
        case K::kList: {
            if (a.is_generator() || b.is_generator()) return &a.items() == &b.items();
            if (a.is_tuple() != b.is_tuple()) return false;
            const auto &x = a.items(), &y = b.items();
            if (x.size() != y.size()) return false;
            for (size_t i = 0; i < x.size(); ++i) {
                if (!equal(x[i], y[i])) return false;
            }
            return true;
        }
        case K::kDict: {
            const Dict &x = a.entries(), &y = b.entries();
            if (x.size() != y.size()) return false;
            for (const auto& [k, v] : x.entries()) {
                const Value* w = y.find(k);
                if (w == nullptr || !equal(v, *w)) return false;
            }
            return true;
        }
        case K::kNamespace:
            return &a.entries() == &b.entries();
        case K::kCallable:
            return &a.function() == &b.function();
        default:
            return false;
    }
}

namespace {

Result<Value> from_json(const nlohmann::ordered_json& j, bool from_input, int depth) {
    if (depth > 64) return invalid_argument("JSON nested deeper than 64 levels");
    switch (j.type()) {
        case nlohmann::ordered_json::value_t::null:
            return Value::none();
        case nlohmann::ordered_json::value_t::boolean:
            return Value::boolean(j.get<bool>());
        case nlohmann::ordered_json::value_t::number_integer:
            return Value::integer(j.get<int64_t>());
        case nlohmann::ordered_json::value_t::number_unsigned: {
            const uint64_t u = j.get<uint64_t>();
            if (u > static_cast<uint64_t>(INT64_MAX)) {
                return invalid_argument("a JSON integer past 2^63 - 1");
            }
            return Value::integer(static_cast<int64_t>(u));
        }
        case nlohmann::ordered_json::value_t::number_float:
            return Value::number(j.get<double>());
        case nlohmann::ordered_json::value_t::string: {
            std::string s = j.get<std::string>();
            return from_input ? Value::input(std::move(s)) : Value::literal(std::move(s));
        }
        case nlohmann::ordered_json::value_t::array: {
            ValueList items;
            items.reserve(j.size());
            for (const auto& e : j) {
                DS_ASSIGN_OR_RETURN(Value v, from_json(e, from_input, depth + 1));
                items.push_back(std::move(v));
            }
            return Value::list(std::move(items));
        }
        case nlohmann::ordered_json::value_t::object: {
            Dict d;
            for (auto it = j.begin(); it != j.end(); ++it) {
                DS_ASSIGN_OR_RETURN(Value v, from_json(it.value(), from_input, depth + 1));
                d.set(it.key(), std::move(v));
            }
            return Value::dict(std::move(d));
        }
        default:
            return invalid_argument("a JSON value of an unsupported type");
    }
}

}  // namespace

Result<Value> value_from_json(std::string_view json, bool from_input) {
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(json, nullptr, false);
    if (j.is_discarded()) return invalid_argument("invalid JSON");
    return from_json(j, from_input, 0);
}

}  // namespace deltaserve::model::jinja
