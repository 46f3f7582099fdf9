// Parses a Jinja template into jinja_ast.h's nodes.
#pragma once

#include <memory>
#include <string_view>

#include "deltaserve/common/status.h"
#include "jinja_ast.h"

namespace deltaserve::model::jinja {

// Errors: kInvalidArgument naming the line and what is wrong (the lexer's errors, a tag
// that is not closed, a construct outside what is implemented, named: "include", "call",
// "recursive loops" and the like).
Result<std::unique_ptr<TemplateAst>> parse_template(std::string_view source);

}  // namespace deltaserve::model::jinja
