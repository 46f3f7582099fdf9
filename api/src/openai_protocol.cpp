#include "deltaserve/api/openai_protocol.h"

#include <nlohmann/json.hpp>

#include "deltaserve/model/tokenizer.h"

namespace deltaserve::api {

namespace {

using json = nlohmann::json;

Status bad(const std::string& field, const std::string& what) {
    return invalid_argument("'" + field + "' " + what);
}

// A number field within [lo, hi], if present.
Status number(const json& j, const char* field, double lo, double hi, float& out) {
    if (!j.contains(field) || j[field].is_null()) return Status();
    if (!j[field].is_number()) return bad(field, "must be a number");
    const double v = j[field].get<double>();
    if (!(v >= lo && v <= hi))
        return bad(field, "must be in [" + json(lo).dump() + ", " + json(hi).dump() + "]");
    out = static_cast<float>(v);
    return Status();
}

Status integer(const json& j, const char* field, int64_t lo, int64_t hi, int64_t& out,
               bool& given) {
    given = false;
    if (!j.contains(field) || j[field].is_null()) return Status();
    if (!j[field].is_number_integer()) return bad(field, "must be an integer");
    const int64_t v = j[field].get<int64_t>();
    if (v < lo || v > hi)
        return bad(field, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    out = v;
    given = true;
    return Status();
}

// A message's content: a string, or an array of {"type": "text", "text": ...} parts.
Result<std::string> content_text(const json& c, size_t i) {
    const std::string field = "messages[" + std::to_string(i) + "].content";
    if (c.is_string()) return c.get<std::string>();
    if (c.is_null()) return std::string();
    if (!c.is_array()) return bad(field, "must be a string or an array of text parts");
    std::string text;
    for (const json& part : c) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string()) {
            return bad(field, "holds a part that is not text (only text is supported)");
        }
        text += part["text"].get<std::string>();
    }
    return text;
}

}  // namespace

Result<ChatRequest> parse_chat_request(std::string_view body,
                                       const model::SamplingParams& defaults) {
    const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return invalid_argument("the request body is not valid JSON");
    if (!j.is_object()) return invalid_argument("the request body must be a JSON object");
    ChatRequest r;
    r.sampling = defaults;
    if (j.contains("model")) {
        if (!j["model"].is_string()) return bad("model", "must be a string");
        r.model = j["model"].get<std::string>();
    }
    if (!j.contains("messages") || !j["messages"].is_array() || j["messages"].empty()) {
        return bad("messages", "must be a non-empty array");
    }
    for (size_t i = 0; i < j["messages"].size(); ++i) {
        const json& m = j["messages"][i];
        const std::string at = "messages[" + std::to_string(i) + "]";
        if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
            return bad(at + ".role", "is missing");
        std::string role = m["role"].get<std::string>();
        if (role == "developer") role = "system";
        if (role != "system" && role != "user" && role != "assistant") {
            return bad(at + ".role", "must be system, user or assistant, not '" + role + "'");
        }
        DS_ASSIGN_OR_RETURN(std::string text, content_text(m.value("content", json()), i));
        if (model::find_invalid_utf8(text) >= 0) return bad(at + ".content", "is not valid UTF-8");
        r.messages.push_back({role, std::move(text)});
    }
    DS_RETURN_IF_ERROR(number(j, "temperature", 0.0, 2.0, r.sampling.temperature));
    DS_RETURN_IF_ERROR(number(j, "top_p", 0.0, 1.0, r.sampling.top_p));
    DS_RETURN_IF_ERROR(number(j, "min_p", 0.0, 1.0, r.sampling.min_p));
    DS_RETURN_IF_ERROR(number(j, "repetition_penalty", 0.0, 10.0, r.sampling.repeat_penalty));
    if (j.contains("top_p") && r.sampling.top_p <= 0.0f) return bad("top_p", "must be > 0");
    int64_t v = 0;
    bool given = false;
    DS_RETURN_IF_ERROR(integer(j, "top_k", -1, 1 << 20, v, given));
    if (given) r.sampling.top_k = static_cast<int32_t>(v < 0 ? 0 : v);
    DS_RETURN_IF_ERROR(integer(j, "seed", INT64_MIN, INT64_MAX, v, given));
    if (given) {
        r.sampling.seed = static_cast<uint64_t>(v);
        r.seed_given = true;
    }
    DS_RETURN_IF_ERROR(integer(j, "max_tokens", 1, 1 << 30, v, given));
    if (given) r.max_tokens = static_cast<int32_t>(v);
    DS_RETURN_IF_ERROR(integer(j, "max_completion_tokens", 1, 1 << 30, v, given));
    if (given) r.max_tokens = static_cast<int32_t>(v);
    DS_RETURN_IF_ERROR(integer(j, "n", 1, 1, v, given));
    if (j.contains("stop") && !j["stop"].is_null()) {
        const json& s = j["stop"];
        if (s.is_string()) {
            r.stop.push_back(s.get<std::string>());
        } else if (s.is_array() && s.size() <= 4) {
            for (const json& x : s) {
                if (!x.is_string())
                    return bad("stop", "must be a string or an array of up to 4 strings");
                r.stop.push_back(x.get<std::string>());
            }
        } else {
            return bad("stop", "must be a string or an array of up to 4 strings");
        }
        for (const std::string& x : r.stop) {
            if (x.empty()) return bad("stop", "must not hold an empty string");
        }
    }
    if (j.contains("stream") && !j["stream"].is_null()) {
        if (!j["stream"].is_boolean()) return bad("stream", "must be true or false");
        r.stream = j["stream"].get<bool>();
    }
    if (j.contains("stream_options") && j["stream_options"].is_object()) {
        r.include_usage = j["stream_options"].value("include_usage", false);
    }
    if (j.contains("session_id") && !j["session_id"].is_null()) {
        if (!j["session_id"].is_string()) return bad("session_id", "must be a string");
        r.session_id = j["session_id"].get<std::string>();
    }
    return r;
}

namespace {

json usage_json(const Usage& u) {
    return {{"prompt_tokens", u.prompt_tokens},
            {"completion_tokens", u.completion_tokens},
            {"total_tokens", u.prompt_tokens + u.completion_tokens},
            {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace

std::string completion_json(const std::string& id, int64_t created, const std::string& model,
                            const std::string& text, const std::string& finish_reason,
                            const Usage& usage, const std::string& session_id) {
    json j = {{"id", id},
              {"object", "chat.completion"},
              {"created", created},
              {"model", model},
              {"choices", json::array({{{"index", 0},
                                        {"message", {{"role", "assistant"}, {"content", text}}},
                                        {"logprobs", nullptr},
                                        {"finish_reason", finish_reason}}})},
              {"usage", usage_json(usage)}};
    if (!session_id.empty()) j["session_id"] = session_id;
    return dump(j);
}

std::string chunk_json(const std::string& id, int64_t created, const std::string& model,
                       const std::optional<std::string>& content, bool first,
                       const std::string& finish_reason, const std::optional<Usage>& usage) {
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
                      {"logprobs", nullptr},
                      {"finish_reason", finish_reason.empty() ? json() : json(finish_reason)}}});
    return dump(j);
}

std::string error_json(const std::string& message, const std::string& type, int code) {
    return dump(
        {{"error", {{"message", message}, {"type", type}, {"param", nullptr}, {"code", code}}}});
}

}  // namespace deltaserve::api
