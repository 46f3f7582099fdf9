#include "openai_unserved.h"

#include <string>

namespace deltaserve::api {

namespace {

// Neutral: left out, null, false, 0, "", or an empty object or array.
bool neutral(const RequestJson& v) {
    if (v.is_null()) return true;
    if (v.is_boolean()) return !v.get<bool>();
    if (v.is_number()) return v.get<double>() == 0.0;
    if (v.is_string()) return v.get_ref<const std::string&>().empty();
    return v.empty();  // object or array
}

}  // namespace

Status refuse_unserved_fields(const RequestJson& j) {
    struct Unserved {
        const char* field;
        const char* instead;
    };
    static const Unserved kUnserved[] = {
        {"logit_bias", "is not supported"},
        {"functions", "is not supported (use tools)"},
        {"function_call", "is not supported (use tool_choice)"},
        {"audio", "is not supported (text only)"},
        {"prediction", "is not supported"},
        {"web_search_options", "is not supported"},
        {"reasoning_effort",
         "is not supported (a template's own switch goes in chat_template_kwargs)"},
        {"verbosity", "is not supported"},
    };
    for (const Unserved& u : kUnserved) {
        auto it = j.find(u.field);
        if (it != j.end() && !neutral(*it)) return bad_field(u.field, u.instead);
    }
    // vLLM's prompt_logprobs (0 asks for the prompt tokens' own): completions serve it.
    if (auto it = j.find("prompt_logprobs"); it != j.end() && !it->is_null())
        return bad_field("prompt_logprobs", "is served on /v1/completions, not on chat");
    if (auto it = j.find("modalities"); it != j.end() && !it->is_null()) {
        const bool text = it->is_array() && it->size() == 1 && (*it)[0] == "text";
        if (!text) return bad_field("modalities", "must be [\"text\"] (text only)");
    }
    return Status();
}

}  // namespace deltaserve::api
