// tool_choice "required" or a named function: the answer is constrained to one call (of any
// of the tools, or of the named one) in the format the chat template teaches, as vLLM and
// llama-server force it. Served through structured output's grammar (the call's JSON Schema
// between the format's markers).
#pragma once

#include <string>
#include <string_view>

#include "deltaserve/common/status.h"
#include "deltaserve/model/tool_calls.h"

namespace deltaserve::api {

struct ForcedCall {
    std::string schema;  // decode::TurnSpec::json_schema
    std::string prefix;  // ... json_prefix
    std::string suffix;  // ... json_suffix
};

// tools_json: the request's tools (ChatRequest::tools_json); name "" for any of them.
// kInvalidArgument naming tool_choice for a format whose calls cannot be forced (mistral's
// control-token markers) or a function whose parameters use a keyword the grammar does not
// enforce (naming it).
Result<ForcedCall> forced_tool_call(model::ToolCallFormat format, std::string_view tools_json,
                                    std::string_view name);

}  // namespace deltaserve::api
