// The Jinja template's tokens, as jinja2's lexer makes them with transformers' settings
// (trim_blocks and lstrip_blocks on): text between tags with the whitespace control applied
// ("-" and "+" markers, the newline after a block or comment tag, the indentation before
// one), comments dropped, raw blocks as text, and the tags' contents as names, literals and
// operators.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "deltaserve/common/status.h"

namespace deltaserve::model::jinja {

enum class TokenKind {
    kText,        // template text (value: its bytes, newlines normalized)
    kVarBegin,    // {{
    kVarEnd,      // }}
    kBlockBegin,  // {%
    kBlockEnd,    // %}
    kName,
    kString,  // value: the decoded literal
    kInt,
    kFloat,
    kOperator,  // value: the operator's text
    kEnd,
};

struct Token {
    TokenKind kind;
    std::string value;
    int line = 1;
    int64_t int_value = 0;
    double float_value = 0;
};

// Errors: kInvalidArgument naming the line (an unterminated tag, string or comment; a
// character that starts no token).
Result<std::vector<Token>> tokenize(std::string_view source);

}  // namespace deltaserve::model::jinja
