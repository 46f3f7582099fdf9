// Jinja values as Python prints them: str(), repr(), json.dumps (the tojson filter as
// transformers defines it), and the UTF-8 code point helpers that Python's string
// indexing, slicing and whitespace need.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "deltaserve/model/jinja_value.h"

namespace deltaserve::model::jinja {

std::string float_repr(double d);  // Python's repr(float): "1.0", "1e-05", "1e+16"
std::string py_repr(const Value& v);
std::string py_str(const Value& v);  // undefined: ""
// str() keeping a string's input ranges; any other value is input as a whole when it holds
// input anywhere.
JinjaText to_text(const Value& v);
// A string made from src's text (trimmed, sliced, cased ...): input when any of src is.
Value derived(const Value& src, std::string s);

// markupsafe's escape: & < > " ' as entities.
std::string html_escape(std::string_view s);

// json.dumps(v, ensure_ascii, indent, separators, sort_keys). indent < 0: none; an
// indent_text wins over indent when set. Errors: kInvalidArgument for a value JSON cannot
// hold (undefined, a namespace, a callable).
struct JsonOptions {
    bool ensure_ascii = false;
    int indent = -1;
    std::string indent_text;
    bool has_indent_text = false;
    std::string item_separator;  // "" = Python's default for the indent
    std::string key_separator;
    bool has_separators = false;
    bool sort_keys = false;
};
Result<std::string> to_json(const Value& v, const JsonOptions& o);

// Byte offsets of each code point's start in s, then s.size(). Bytes of broken UTF-8 count
// one each.
std::vector<size_t> code_points(std::string_view s);
uint32_t decode_code_point(std::string_view s, size_t at);
// Python's str.isspace() for one code point.
bool is_py_space(uint32_t cp);

}  // namespace deltaserve::model::jinja
