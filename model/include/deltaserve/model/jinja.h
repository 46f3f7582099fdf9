// A Jinja template engine for chat templates: renders the model's own
// `tokenizer.chat_template` as transformers' apply_chat_template does with Python's jinja2
// (ImmutableSandboxedEnvironment, trim_blocks and lstrip_blocks, the loopcontrols extension,
// the globals raise_exception and strftime_now, tojson as json.dumps with
// ensure_ascii=False, the generation block rendered as its body).
//
// Implemented: text, {{ }}, comments and raw blocks with jinja2's whitespace control; if /
// elif / else, for (else, loop filters, unpacking, the loop variable, break, continue), set
// (names, tuples, namespace attributes, blocks), macros, filter blocks; jinja2's operators,
// literals, slices, calls; the filters and tests of jinja2 that templates use and Python's
// str / dict / list methods that do not change anything. Anything else (include, extends,
// import, call blocks, recursive loops, a filter, test or method not listed) is refused,
// naming it: at parse time for statements, when evaluated for the rest.
//
// Templates are untrusted: a render is bounded in steps, output bytes and nesting, and a
// template that passes a bound fails with kResourceExhausted instead of running on.
#pragma once

#include <cstdint>
#include <ctime>
#include <memory>
#include <string_view>

#include "deltaserve/common/status.h"
#include "deltaserve/model/jinja_value.h"

namespace deltaserve::model::jinja {

struct TemplateAst;

struct RenderOptions {
    // strftime_now's clock (seconds since the epoch, shown in UTC). Default: the time of
    // the call.
    std::time_t now = -1;
    // Statements, loop iterations and calls one render may run. Default: 5,000,000.
    int64_t max_steps = 5'000'000;
    // Bytes of output (and of any string the render builds into it). Default: 16 MiB.
    size_t max_output = size_t{16} << 20;
};

class JinjaTemplate {
  public:
    // Errors: kInvalidArgument naming the line and the construct.
    static Result<JinjaTemplate> parse(std::string_view source);

    // Renders with the variables of `context` (a dict). Errors: kInvalidArgument for what
    // the template does wrong or refuses (raise_exception's message is the error's, prefixed
    // "chat template: "), kResourceExhausted past the options' bounds.
    Result<JinjaText> render(const Value& context, const RenderOptions& options = {}) const;

  private:
    explicit JinjaTemplate(std::shared_ptr<const TemplateAst> ast) : ast_(std::move(ast)) {}
    std::shared_ptr<const TemplateAst> ast_;
};

}  // namespace deltaserve::model::jinja
