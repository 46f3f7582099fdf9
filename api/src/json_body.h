// A request body parsed as JSON under the protocol's limits (openai_protocol.h): nesting and
// value counts checked on the bytes before anything is built, and an object that names a key
// twice refused (parsers disagree on which value wins: a proxy and this server must not read
// two different requests from one body).
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>

#include "deltaserve/common/status.h"

namespace deltaserve::api {

// Errors: kInvalidArgument for a body that is not JSON, nests deeper than kMaxJsonDepth,
// holds more than kMaxJsonElements values, or has a duplicate key in any object (named).
Result<nlohmann::json> parse_json_body(std::string_view body);
// The same, keeping each object's keys in the body's order (what a chat template's tojson
// shows the model of a request's tools and tool calls).
Result<nlohmann::ordered_json> parse_ordered_json_body(std::string_view body);

}  // namespace deltaserve::api
