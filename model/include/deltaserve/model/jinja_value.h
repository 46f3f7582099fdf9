// The values a Jinja chat template computes with, as Python's jinja2 sees them: undefined,
// none, booleans, integers, floats, strings, lists, dicts (insertion-ordered, string keys),
// namespaces and callables.
//
// A string remembers which of its bytes came from the caller's input (messages, tools,
// request keys) rather than from the template's own literals (JinjaText::input), through
// concatenation and into the rendered prompt, so the tokenizer can encode the template's
// markers as control tokens and never read one out of user text.
//
// Values are immutable and cheap to copy (shared); only a namespace's attributes change, as
// jinja2's sandbox allows. Not thread-safe to share while a render is changing a namespace.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "deltaserve/common/status.h"

namespace deltaserve::model::jinja {

// A string and the byte ranges [begin, end) of it that came from input, sorted, disjoint
// and not adjacent.
struct JinjaText {
    std::string text;
    std::vector<std::pair<size_t, size_t>> input;

    bool has_input() const { return !input.empty(); }
    void append(const JinjaText& other);
    void append_literal(std::string_view s) { text.append(s); }
    void append_input(std::string_view s);
};

class Value;
struct CallArgs;
class Dict;

using ValueList = std::vector<Value>;
using NativeFn = std::function<Result<Value>(CallArgs&)>;

class Value {
  public:
    enum class Kind {
        kUndefined,
        kNone,
        kBool,
        kInt,
        kFloat,
        kString,
        kList,
        kDict,
        kNamespace,
        kCallable
    };

    Value() = default;  // undefined
    static Value undefined(std::string name);
    static Value none();
    static Value boolean(bool b);
    static Value integer(int64_t i);
    static Value number(double d);
    static Value literal(std::string s);  // a string of the template's own
    static Value input(std::string s);    // a string from the caller's input
    static Value string(JinjaText t);
    // A string the template marked safe (|safe, |e): markupsafe's Markup, which escapes
    // the plain strings added to it with +.
    static Value markup(JinjaText t);
    static Value list(ValueList items);
    // A Python tuple: a list that prints in parentheses and is never equal to a list.
    static Value tuple(ValueList items);
    // What jinja2's lazy filters return (map, select, reject, selectattr, rejectattr,
    // reverse, items): iterable once made, but always true, without a length, not
    // subscriptable and not JSON, as a Python generator or iterator is.
    static Value generator(ValueList items, std::string type_name);
    static Value dict(Dict d);
    static Value make_namespace(Dict d);
    static Value callable(std::string name, NativeFn fn);

    Kind kind() const { return kind_; }
    bool is_undefined() const { return kind_ == Kind::kUndefined; }
    bool is_none() const { return kind_ == Kind::kNone; }
    bool is_string() const { return kind_ == Kind::kString; }
    bool is_markup() const { return kind_ == Kind::kString && markup_; }
    bool is_list() const { return kind_ == Kind::kList; }
    bool is_generator() const { return kind_ == Kind::kList && generator_; }
    bool is_tuple() const { return kind_ == Kind::kList && tuple_; }
    bool is_dict() const { return kind_ == Kind::kDict; }
    bool is_mapping() const { return kind_ == Kind::kDict || kind_ == Kind::kNamespace; }
    // Python's int (bool included) and float.
    bool is_number() const {
        return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool;
    }
    bool is_integer() const { return kind_ == Kind::kInt || kind_ == Kind::kBool; }

    bool as_bool() const { return b_; }
    int64_t as_int() const { return kind_ == Kind::kBool ? (b_ ? 1 : 0) : i_; }
    double as_double() const { return kind_ == Kind::kFloat ? f_ : static_cast<double>(as_int()); }
    const JinjaText& text() const { return *s_; }
    const std::string& str() const { return s_->text; }
    const ValueList& items() const { return *l_; }
    const Dict& entries() const { return *d_; }
    Dict& namespace_entries() const { return *d_; }  // kNamespace only
    const std::string& callable_name() const { return name_; }
    const NativeFn& function() const { return *fn_; }
    // For undefined: the name whose lookup failed ("" when none).
    const std::string& undefined_name() const { return name_; }

    // Python truthiness (jinja2's: undefined is false).
    bool truthy() const;
    // Whether a string anywhere inside came from input.
    bool contains_input() const;
    // The name of the kind as Python says it ("str", "int", "list", "dict", "NoneType").
    std::string_view type_name() const;

  private:
    Kind kind_ = Kind::kUndefined;
    bool b_ = false;
    int64_t i_ = 0;
    double f_ = 0;
    std::shared_ptr<const JinjaText> s_;
    std::shared_ptr<const ValueList> l_;
    std::shared_ptr<Dict> d_;
    std::shared_ptr<const NativeFn> fn_;
    std::string name_;
    bool generator_ = false;
    bool markup_ = false;
    bool tuple_ = false;
};

// String keys in insertion order; set() replaces in place, as a Python dict does.
class Dict {
  public:
    const Value* find(std::string_view key) const;
    void set(std::string key, Value v);
    size_t size() const { return entries_.size(); }
    bool empty() const { return entries_.empty(); }
    const std::vector<std::pair<std::string, Value>>& entries() const { return entries_; }

  private:
    std::vector<std::pair<std::string, Value>> entries_;
};

// A call's positional and keyword arguments.
struct CallArgs {
    ValueList args;
    std::vector<std::pair<std::string, Value>> kwargs;

    // The argument named `name` or at `position` (-1: keyword only); undefined when absent.
    // Errors: kInvalidArgument when it is given both ways.
    Result<Value> get(std::string_view name, int position) const;
    // kInvalidArgument naming `fn` when more than `max_positional` arguments or a keyword
    // outside `known` is given.
    Status check(std::string_view fn, size_t max_positional,
                 std::initializer_list<std::string_view> known) const;
};

// Python's == between two values (1 == 1.0 == True; lists and dicts by content).
bool equal(const Value& a, const Value& b);

// Parses JSON text into values, every string marked `from_input` (objects keep their key
// order). Errors: kInvalidArgument for invalid JSON or integers past int64.
Result<Value> value_from_json(std::string_view json, bool from_input);

}  // namespace deltaserve::model::jinja
