// The chat request parser (POST /v1/chat/completions bodies): any bytes give a request or a
// kInvalidArgument, never an exception or a crash; what it accepts renders as a prompt, and
// its tools and whole messages are the JSON the template takes. The same bytes as a text
// completion's body (POST /v1/completions): a raw prompt or a kInvalidArgument.
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string_view>

#include "deltaserve/api/openai_protocol.h"
#include "deltaserve/model/chat_template.h"
#include "openai_completions.h"

using namespace deltaserve;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view body(reinterpret_cast<const char*>(data), size);
    model::SamplingParams defaults;
    auto c = api::parse_completion_request(body, defaults);
    if (!c.ok() && c.error().code() != StatusCode::kInvalidArgument) std::abort();
    if (c.ok() &&
        (!c->turn.raw_prompt || (c->turn.prompt_text.empty() && c->turn.prompt_ids.empty())))
        std::abort();
    auto r = api::parse_chat_request(body, defaults);
    if (!r.ok()) {
        if (r.error().code() != StatusCode::kInvalidArgument) std::abort();
        return 0;
    }
    if (r->messages.empty()) std::abort();  // "no messages" is a 400
    const model::ChatTemplate chatml;
    // Whole messages (tool calls, content null) may make ChatML raise, as jinja2 does: a 400.
    const auto whole = model::apply_chat_template(chatml, r->messages, true);
    if (!whole.ok() && whole.error().code() != StatusCode::kInvalidArgument) std::abort();
    auto plain = r->messages;
    for (auto& m : plain) m.json.clear();
    const auto prompt = model::apply_chat_template(chatml, plain, true);
    if (!prompt.ok()) std::abort();
    for (const auto& m : r->messages) {
        if (prompt->find(m.content) == std::string::npos) std::abort();
        // A message with tool calls or a tool_call_id reaches the template as an object of
        // its own role.
        if (!m.json.empty()) {
            const auto j = nlohmann::json::parse(m.json, nullptr, false);
            if (!j.is_object() || j.value("role", "") != m.role) std::abort();
        }
    }
    if (!r->tools_json.empty()) {
        const auto tools = nlohmann::json::parse(r->tools_json, nullptr, false);
        if (!tools.is_array() || tools.empty() || !r->parse_tool_calls) std::abort();
    }
    return 0;
}
