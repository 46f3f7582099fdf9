#include "deltaserve/api/openai_protocol.h"

#include <algorithm>
#include <climits>
#include <nlohmann/json.hpp>

#include "deltaserve/model/tokenizer.h"
#include "json_body.h"
#include "json_fields.h"
#include "openai_generation.h"
#include "openai_logprobs.h"
#include "openai_response_format.h"
#include "openai_tools.h"
#include "openai_unserved.h"

namespace deltaserve::api {

namespace {

using json = RequestJson;

// A message's content: a string, or an array of {"type": "text", "text": ...} parts.
Result<std::string> content_text(const json* c, const std::string& field) {
    if (c == nullptr) return std::string();
    if (c->is_string()) return c->get<std::string>();
    if (!c->is_array()) return bad_field(field, "must be a string or an array of text parts");
    std::string text;
    for (size_t i = 0; i < c->size(); ++i) {
        const json& part = (*c)[i];
        const std::string at = field + "[" + std::to_string(i) + "]";
        if (!part.is_object()) return bad_field(at, "must be an object");
        const json* type = field_of(part, "type");
        if (type == nullptr || !type->is_string())
            return bad_field(at + ".type", "must be a string");
        if (type->get<std::string>() != "text") {
            return bad_field(at + ".type", "is '" + type->get<std::string>().substr(0, 32) +
                                               "', not text (only text parts are supported)");
        }
        const json* t = field_of(part, "text");
        if (t == nullptr || !t->is_string()) return bad_field(at + ".text", "must be a string");
        text += t->get<std::string>();
    }
    return text;
}

Result<std::vector<model::ChatMessage>> parse_messages(const json& j) {
    const json* ms = field_of(j, "messages");
    if (ms == nullptr || !ms->is_array() || ms->empty())
        return bad_field("messages", "must be a non-empty array");
    if (ms->size() > kMaxMessages)
        return bad_field("messages",
                         "holds more than " + std::to_string(kMaxMessages) + " messages");
    std::vector<model::ChatMessage> out;
    for (size_t i = 0; i < ms->size(); ++i) {
        const json& m = (*ms)[i];
        const std::string at = "messages[" + std::to_string(i) + "]";
        if (!m.is_object()) return bad_field(at, "must be an object");
        const json* r = field_of(m, "role");
        if (r == nullptr || !r->is_string()) return bad_field(at + ".role", "must be a string");
        std::string role = r->get<std::string>();
        if (role == "developer") role = "system";
        if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
            return bad_field(at + ".role",
                             "must be system, developer, user, assistant or tool, not '" +
                                 role.substr(0, 32) + "'");
        }
        const json* content = field_of(m, "content");
        DS_ASSIGN_OR_RETURN(std::string text, content_text(content, at + ".content"));
        if (model::find_invalid_utf8(text) >= 0)
            return bad_field(at + ".content", "is not valid UTF-8");
        model::ChatMessage message{role, std::move(text)};
        DS_RETURN_IF_ERROR(parse_message_extras(m, at, content != nullptr, message));
        out.push_back(std::move(message));
    }
    return out;
}

Result<ChatRequest> parse_object(const json& j, const model::SamplingParams& defaults) {
    ChatRequest r;
    r.sampling = defaults;
    if (const json* m = field_of(j, "model")) {
        if (!m->is_string()) return bad_field("model", "must be a string");
        r.model = m->get<std::string>();
        if (r.model.size() > kMaxModelNameBytes) return bad_field("model", "is too long");
    }
    DS_ASSIGN_OR_RETURN(r.messages, parse_messages(j));
    if (const json* kw = field_of(j, "chat_template_kwargs"); kw != nullptr && !kw->is_null()) {
        if (!kw->is_object()) return bad_field("chat_template_kwargs", "must be an object");
        if (kw->contains("messages") || kw->contains("tools") ||
            kw->contains("add_generation_prompt")) {
            return bad_field("chat_template_kwargs",
                             "must not set messages, tools or add_generation_prompt");
        }
        r.chat_template_kwargs = kw->dump();
    }
    DS_RETURN_IF_ERROR(parse_generation_fields(j, r));
    int64_t v = 0;
    bool given = false;
    DS_RETURN_IF_ERROR(integer_field(j, "max_completion_tokens", 1, 1 << 30, v, given));
    if (given) r.max_tokens = static_cast<int32_t>(v);
    DS_RETURN_IF_ERROR(parse_logprobs_fields(j, r.top_logprobs));
    DS_RETURN_IF_ERROR(refuse_unserved_fields(j));
    DS_RETURN_IF_ERROR(parse_tool_fields(j, r));
    DS_RETURN_IF_ERROR(parse_response_format(j, r));
    if (r.force_tool_call && !r.json_schema.empty()) {
        return bad_field("tool_choice", "cannot force a call and a response_format together");
    }
    if (const json* id = field_of(j, "session_id")) {
        if (!id->is_string()) return bad_field("session_id", "must be a string");
        r.session_id = id->get<std::string>();
        DS_RETURN_IF_ERROR(check_session_id(r.session_id, "session_id"));
    }
    DS_RETURN_IF_ERROR(integer_field(j, "expected_turn", 0, INT32_MAX, v, given));
    if (given) r.expected_turn = static_cast<int32_t>(v);
    return r;
}

}  // namespace

Status check_session_id(std::string_view id, std::string_view field) {
    auto allowed = [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '.' || c == '_' || c == ':' || c == '-';
    };
    if (id.empty() || id.size() > kMaxSessionIdBytes ||
        !std::all_of(id.begin(), id.end(), allowed)) {
        return invalid_argument("'" + std::string(field) + "' must be 1 to " +
                                std::to_string(kMaxSessionIdBytes) +
                                " characters of A-Z a-z 0-9 . _ : -");
    }
    return Status();
}

Result<ChatRequest> parse_chat_request(std::string_view body,
                                       const model::SamplingParams& defaults) {
    DS_ASSIGN_OR_RETURN(const json j, parse_ordered_json_body(body));
    if (!j.is_object()) return invalid_argument("the request body must be a JSON object");
    try {  // every access above is type-checked; this is the last line, not the plan
        return parse_object(j, defaults);
    } catch (const json::exception& e) {
        return invalid_argument(std::string("malformed request: ") + e.what());
    }
}

namespace {}  // namespace

std::string completion_json(const std::string& id, int64_t created, const std::string& model,
                            const std::string& text, const std::string& finish_reason,
                            const Usage& usage, const std::string& session_id,
                            const SessionAnswer& session,
                            const std::vector<model::ToolCall>& tool_calls,
                            const std::vector<LogprobEntry>* logprobs) {
    json message = {{"role", "assistant"},
                    {"content", text.empty() && !tool_calls.empty() ? json() : json(text)}};
    if (!tool_calls.empty()) {
        json calls = json::array();
        for (const model::ToolCall& c : tool_calls) {
            calls.push_back({{"id", c.id},
                             {"type", "function"},
                             {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
        }
        message["tool_calls"] = std::move(calls);
    }
    json j = {{"id", id},
              {"object", "chat.completion"},
              {"created", created},
              {"model", model},
              {"choices", json::array({{{"index", 0},
                                        {"message", std::move(message)},
                                        {"logprobs", chat_logprobs_json(logprobs)},
                                        {"finish_reason", finish_reason}}})},
              {"usage", usage_json(usage)}};
    if (!session_id.empty()) j["session_id"] = session_id;
    if (session.turn >= 0) {
        j["session_turn"] = session.turn;
        j["session_stored"] = session.stored;
    }
    return dump(j);
}

std::string chunk_json(const std::string& id, int64_t created, const std::string& model,
                       const std::optional<std::string>& content, bool first,
                       const std::string& finish_reason, const std::optional<Usage>& usage,
                       const SessionAnswer& session, const std::vector<LogprobEntry>* logprobs) {
    json j = {
        {"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", model}};
    if (usage) {
        j["choices"] = json::array();
        j["usage"] = usage_json(*usage);
        return dump(j);
    }
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (content) delta["content"] = *content;
    j["choices"] =
        json::array({{{"index", 0},
                      {"delta", delta},
                      {"logprobs", chat_logprobs_json(logprobs)},
                      {"finish_reason", finish_reason.empty() ? json() : json(finish_reason)}}});
    if (session.turn >= 0) {
        j["session_turn"] = session.turn;
        j["session_stored"] = session.stored;
    }
    return dump(j);
}

std::string tool_call_chunk_json(const std::string& id, int64_t created, const std::string& model,
                                 int index, const model::ToolCall& call, int part, bool first) {
    json c = {{"index", index}};
    if (part == 0) {
        c["id"] = call.id;
        c["type"] = "function";
        c["function"] = {{"name", call.name}, {"arguments", ""}};
    } else {
        c["function"] = {{"arguments", call.arguments}};
    }
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    delta["tool_calls"] = json::array({std::move(c)});
    return dump({{"id", id},
                 {"object", "chat.completion.chunk"},
                 {"created", created},
                 {"model", model},
                 {"choices", json::array({{{"index", 0},
                                           {"delta", std::move(delta)},
                                           {"logprobs", nullptr},
                                           {"finish_reason", nullptr}}})}});
}

std::string error_json(const std::string& message, const std::string& type, int status,
                       const std::string& code) {
    return dump({{"error",
                  {{"message", message},
                   {"type", type},
                   {"param", nullptr},
                   {"code", code.empty() ? json(status) : json(code)}}}});
}

}  // namespace deltaserve::api
