#include "json_body.h"

#include <string>
#include <unordered_set>
#include <vector>

#include "deltaserve/api/openai_protocol.h"

namespace deltaserve::api {

namespace {

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

template <typename Json>
Result<Json> parse_body(std::string_view body) {
    DS_RETURN_IF_ERROR(check_json_shape(body));
    std::vector<std::unordered_set<std::string>> keys;  // of each object open
    std::string duplicate;
    bool found = false;
    using Event = typename Json::parse_event_t;
    const typename Json::parser_callback_t seen = [&](int, Event event, Json& parsed) {
        switch (event) {
            case Event::object_start:
                keys.emplace_back();
                break;
            case Event::object_end:
                if (!keys.empty()) keys.pop_back();
                break;
            case Event::key:
                if (!found && !keys.empty() && parsed.is_string() &&
                    !keys.back().insert(parsed.template get_ref<const std::string&>()).second) {
                    found = true;
                    duplicate = parsed.template get_ref<const std::string&>();
                }
                break;
            default:
                break;
        }
        return true;
    };
    Json j = Json::parse(body, seen, /*allow_exceptions=*/false);
    if (j.is_discarded()) return invalid_argument("the request body is not valid JSON");
    if (found) {
        return invalid_argument("the request body names the key '" + duplicate.substr(0, 64) +
                                "' twice in one object");
    }
    return j;
}

}  // namespace

Result<nlohmann::json> parse_json_body(std::string_view body) {
    return parse_body<nlohmann::json>(body);
}

Result<nlohmann::ordered_json> parse_ordered_json_body(std::string_view body) {
    return parse_body<nlohmann::ordered_json>(body);
}

}  // namespace deltaserve::api
