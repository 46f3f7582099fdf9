#include "json_body.h"

#include <string>
#include <unordered_set>
#include <vector>

#include "deltaserve/api/openai_protocol.h"

namespace deltaserve::api {

namespace {

using json = nlohmann::json;

// Walks the body's brackets before nlohmann builds anything, so that a deeply nested or
// element-heavy body is refused before it costs memory or stack.
Status check_json_shape(std::string_view body) {
    int depth = 0;
    size_t elements = 0;
    bool in_string = false, escaped = false;
    for (const char c : body) {
        if (in_string) {
            if (escaped) {
                escaped = false;
            } else if (c == '\\') {
                escaped = true;
            } else if (c == '"') {
                in_string = false;
            }
            continue;
        }
        switch (c) {
            case '"':
                in_string = true;
                break;
            case '{':
            case '[':
                if (++depth > kMaxJsonDepth) {
                    return invalid_argument("the request body nests deeper than " +
                                            std::to_string(kMaxJsonDepth) + " levels");
                }
                ++elements;
                break;
            case '}':
            case ']':
                --depth;
                break;
            case ',':
                ++elements;
                break;
            default:
                break;
        }
        if (elements > kMaxJsonElements) {
            return invalid_argument("the request body holds more than " +
                                    std::to_string(kMaxJsonElements) + " JSON values");
        }
    }
    return Status();
}

}  // namespace

Result<json> parse_json_body(std::string_view body) {
    DS_RETURN_IF_ERROR(check_json_shape(body));
    std::vector<std::unordered_set<std::string>> keys;  // of each object open
    std::string duplicate;
    bool found = false;
    const json::parser_callback_t seen = [&](int, json::parse_event_t event, json& parsed) {
        switch (event) {
            case json::parse_event_t::object_start:
                keys.emplace_back();
                break;
            case json::parse_event_t::object_end:
                if (!keys.empty()) keys.pop_back();
                break;
            case json::parse_event_t::key:
                if (!found && !keys.empty() && parsed.is_string() &&
                    !keys.back().insert(parsed.get_ref<const std::string&>()).second) {
                    found = true;
                    duplicate = parsed.get_ref<const std::string&>();
                }
                break;
            default:
                break;
        }
        return true;
    };
    json j = json::parse(body, seen, /*allow_exceptions=*/false);
    if (j.is_discarded()) return invalid_argument("the request body is not valid JSON");
    if (found) {
        return invalid_argument("the request body names the key '" + duplicate.substr(0, 64) +
                                "' twice in one object");
    }
    return j;
}

}  // namespace deltaserve::api
