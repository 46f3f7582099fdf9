// Structured output fields of a chat request: OpenAI's response_format (text, json_object,
// json_schema), and the same asked the peers' ways: llama-server's top-level json_schema and
// json_object's schema, vLLM's guided_json. The other peers' grammar fields (grammar,
// guided_regex, guided_choice, guided_grammar) are refused by name.
#pragma once

#include "deltaserve/api/openai_protocol.h"
#include "json_fields.h"

namespace deltaserve::api {

// Into r.json_schema (compact; "" for free text), after compiling it once
// (model::json_schema_grammar), so that a schema the engine cannot enforce is refused here,
// naming the keyword. Errors (kInvalidArgument) name the field.
Status parse_response_format(const RequestJson& j, ChatRequest& r);

// The check both APIs share: schema (JSON text) into r.json_schema, compact, once the
// engine can enforce it ("" leaves the answer free text).
Status set_response_schema(std::string_view schema, ChatRequest& r);

}  // namespace deltaserve::api
