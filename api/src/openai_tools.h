// The tool-calling fields of a chat request, checked as OpenAI defines them: tools,
// tool_choice and parallel_tool_calls; an assistant message's tool_calls and a tool
// message's tool_call_id.
#pragma once

#include <string>

#include "deltaserve/api/openai_protocol.h"
#include "json_fields.h"

namespace deltaserve::api {

// tools, tool_choice and parallel_tool_calls of the request j into r (tools_json,
// parse_tool_calls, parallel_tool_calls). Errors (kInvalidArgument) name the field.
Status parse_tool_fields(const RequestJson& j, ChatRequest& r);

// What a message has beyond its role and text: an assistant's tool_calls (their arguments
// parsed into objects, as transformers' templates take them), a tool message's
// tool_call_id, a name, an assistant's reasoning_content. Where it has any, out.json is the
// message as the template sees it, with content null where the message had none.
Status parse_message_extras(const RequestJson& m, const std::string& at, bool has_content,
                            model::ChatMessage& out);

}  // namespace deltaserve::api
