// What jinja2 provides under a template: attribute and item lookup (with Python's str, dict
// and list methods as the sandbox allows them), comparison and arithmetic, the built-in
// filters and tests. Errors are kInvalidArgument naming the filter, test, method or
// operation.
#pragma once

#include <string_view>

#include "deltaserve/model/jinja_value.h"

namespace deltaserve::model::jinja {

// x.name: a method bound to x, else x["name"]; undefined when neither (an error when x is
// itself undefined, as jinja2's Undefined raises).
Result<Value> get_attribute(const Value& x, std::string_view name);
// x[key]: by index (negative from the end) or key, else an attribute; undefined when
// neither.
Result<Value> get_item(const Value& x, const Value& key);
// x[start:stop:step] of a list or string (undefined parts: omitted).
Result<Value> get_slice(const Value& x, const Value& start, const Value& stop, const Value& step);

// Python's <: -1, 0, 1. Errors: types Python does not order.
Result<int> compare(const Value& a, const Value& b);
// Python's `a in b`.
Result<bool> contains(const Value& container, const Value& item);
// + - * / // % ** and ~ (op as written).
Result<Value> arithmetic(std::string_view op, const Value& a, const Value& b);
// The values a for-loop visits: a list's items, a dict's keys, a string's characters,
// nothing for undefined.
Result<ValueList> iterate(const Value& x);

Result<Value> apply_filter(std::string_view name, const Value& x, CallArgs& args);
Result<bool> apply_test(std::string_view name, const Value& x, CallArgs& args);
bool has_filter(std::string_view name);
bool has_test(std::string_view name);

}  // namespace deltaserve::model::jinja
