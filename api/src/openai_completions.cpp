#include "openai_completions.h"

#include <algorithm>
#include <climits>

#include "deltaserve/model/token_logprobs.h"
#include "json_body.h"
#include "json_fields.h"
#include "openai_generation.h"

namespace deltaserve::api {

namespace {

using json = RequestJson;

// The prompt: a string, token ids, or a list holding one of them.
Status parse_prompt(const json& j, ChatRequest& r) {
    const json* p = field_of(j, "prompt");
    if (p == nullptr) return bad_field("prompt", "is required");
    const char* must = "must be a string or a list of token ids";
    if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) {
        p = &(*p)[0];  // one prompt in a list
    } else if (p->is_array() && !p->empty() && ((*p)[0].is_string() || (*p)[0].is_array())) {
        return bad_field("prompt",
                         "holds " + std::to_string(p->size()) + " prompts; send one per request");
    }
    if (p->is_string()) {
        r.prompt_text = p->get<std::string>();
        if (r.prompt_text.empty()) return bad_field("prompt", "is empty");
        if (model::find_invalid_utf8(r.prompt_text) >= 0)
            return bad_field("prompt", "is not valid UTF-8");
        return Status();
    }
    if (!p->is_array()) return bad_field("prompt", must);
    if (p->empty()) return bad_field("prompt", "is empty");
    for (const json& id : *p) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
            return bad_field("prompt", must);
        r.prompt_ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
    return Status();
}

// The fields of a completion deltaserve does not serve, refused when not neutral.
Status refuse_unserved(const json& j, const CompletionRequest& c) {
    if (const json* s = field_of(j, "suffix"); s != nullptr && !(s->is_string() && s->empty()))
        return bad_field("suffix", "is not supported (insertion is not served)");
    if (const json* b = field_of(j, "best_of"); b != nullptr && !(b->is_number() && *b == 1))
        return bad_field("best_of", "must be 1");
    if (const json* b = field_of(j, "logit_bias"); b != nullptr && !b->empty())
        return bad_field("logit_bias", "is not supported");
    if (c.turn.prompt_logprobs >= 0 && c.turn.stream) {
        return bad_field(c.listed_top >= 0 ? "prompt_logprobs" : "echo",
                         "with the prompt's logprobs cannot be streamed; set stream false");
    }
    return Status();
}

// Legacy completions' logprobs: the echoed prompt's tokens (top of each), then the answer's.
json text_logprobs_json(const std::vector<LogprobEntry>* entries, size_t offset,
                        const std::vector<LogprobEntry>* echoed = nullptr, int32_t echoed_top = 0) {
    if (entries == nullptr) return nullptr;
    json tokens = json::array(), values = json::array(), tops = json::array(),
         offsets = json::array();
    const auto add = [&](const LogprobEntry& e, size_t n_top) {
        tokens.push_back(e.chosen.bytes);
        offsets.push_back(offset);
        // Offsets in characters, as Python indexes the text (a UTF-8 lead byte each).
        for (char c : e.chosen.bytes) offset += (static_cast<uint8_t>(c) & 0xc0) != 0x80;
        if (!e.scored) {
            values.push_back(nullptr);
            tops.push_back(nullptr);
            return;
        }
        values.push_back(e.chosen.logprob);
        json top = json::object();
        if (e.top.empty() || n_top == 0) top[e.chosen.bytes] = e.chosen.logprob;
        for (size_t i = 0; i < e.top.size() && i < n_top; ++i) {
            if (!top.contains(e.top[i].bytes)) top[e.top[i].bytes] = e.top[i].logprob;
        }
        tops.push_back(std::move(top));
    };
    if (echoed != nullptr) {
        for (const LogprobEntry& e : *echoed) add(e, static_cast<size_t>(echoed_top));
    }
    for (const LogprobEntry& e : *entries) add(e, e.top.size());
    return {{"tokens", std::move(tokens)},
            {"token_logprobs", std::move(values)},
            {"top_logprobs", std::move(tops)},
            {"text_offset", std::move(offsets)}};
}

// vLLM's prompt_logprobs: per prompt token (null for the first) its id's entry and the
// n_top most likely, each {logprob, rank, decoded_token}.
json listed_prompt_json(const std::vector<LogprobEntry>& entries, int32_t n_top) {
    json out = json::array();
    for (const LogprobEntry& e : entries) {
        if (!e.scored) {
            out.push_back(nullptr);
            continue;
        }
        json place = json::object();
        place[std::to_string(e.chosen.id)] = {
            {"logprob", e.chosen.logprob}, {"rank", e.rank}, {"decoded_token", e.chosen.bytes}};
        for (size_t i = 0; i < e.top.size() && i < static_cast<size_t>(n_top); ++i) {
            const std::string key = std::to_string(e.top[i].id);
            if (place.contains(key)) continue;
            place[key] = {{"logprob", e.top[i].logprob},
                          {"rank", static_cast<int64_t>(i) + 1},
                          {"decoded_token", e.top[i].bytes}};
        }
        out.push_back(std::move(place));
    }
    return out;
}

json head(const std::string& id, int64_t created, const std::string& model) {
    return {{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model}};
}

}  // namespace

Result<CompletionRequest> parse_completion_request(std::string_view body,
                                                   const model::SamplingParams& defaults) {
    DS_ASSIGN_OR_RETURN(const json j, parse_ordered_json_body(body));
    if (!j.is_object()) return invalid_argument("the request body must be a JSON object");
    try {
        CompletionRequest c;
        ChatRequest& r = c.turn;
        r.raw_prompt = true;
        r.sampling = defaults;
        r.max_tokens = 16;  // OpenAI's and vLLM's default for completions
        if (const json* m = field_of(j, "model")) {
            if (!m->is_string()) return bad_field("model", "must be a string");
            r.model = m->get<std::string>();
            if (r.model.size() > kMaxModelNameBytes) return bad_field("model", "is too long");
        }
        DS_RETURN_IF_ERROR(parse_prompt(j, r));
        DS_RETURN_IF_ERROR(parse_generation_fields(j, r));
        DS_RETURN_IF_ERROR(boolean_field(j, "echo", "echo", c.echo));
        // logprobs is a count here (0-20: vLLM's limit; OpenAI's is 5).
        int64_t n = 0;
        bool given = false;
        DS_RETURN_IF_ERROR(integer_field(j, "logprobs", 0, model::kMaxTopLogprobs, n, given));
        if (given) r.top_logprobs = static_cast<int32_t>(n);
        if (c.echo) c.echoed_top = r.top_logprobs;
        // vLLM's prompt_logprobs: a count (0-20) or null.
        if (const json* p = field_of(j, "prompt_logprobs"); p != nullptr && !p->is_null()) {
            DS_RETURN_IF_ERROR(
                integer_field(j, "prompt_logprobs", 0, model::kMaxTopLogprobs, n, given));
            c.listed_top = static_cast<int32_t>(n);
        }
        r.prompt_logprobs = std::max(c.echoed_top, c.listed_top);
        DS_RETURN_IF_ERROR(refuse_unserved(j, c));
        return c;
    } catch (const json::exception& e) {
        return invalid_argument(std::string("malformed request: ") + e.what());
    }
}

std::string text_completion_json(const std::string& id, int64_t created, const std::string& model,
                                 const std::string& text, const std::string& finish_reason,
                                 const Usage& usage, const std::vector<LogprobEntry>* logprobs,
                                 size_t text_offset, const PromptScores& prompt) {
    json j = head(id, created, model);
    const bool echoed = prompt.entries != nullptr && prompt.echoed_top >= 0;
    json choice = {
        {"index", 0},
        {"text", text},
        {"logprobs", text_logprobs_json(logprobs, text_offset, echoed ? prompt.entries : nullptr,
                                        prompt.echoed_top)},
        {"finish_reason", finish_reason}};
    if (prompt.entries != nullptr && prompt.listed_top >= 0)
        choice["prompt_logprobs"] = listed_prompt_json(*prompt.entries, prompt.listed_top);
    j["choices"] = json::array({std::move(choice)});
    j["usage"] = usage_json(usage);
    return dump(j);
}

std::string text_completion_chunk_json(const std::string& id, int64_t created,
                                       const std::string& model, const std::string& text,
                                       const std::string& finish_reason,
                                       const std::optional<Usage>& usage,
                                       const std::vector<LogprobEntry>* logprobs,
                                       size_t text_offset) {
    json j = head(id, created, model);
    if (usage) {
        j["choices"] = json::array();
        j["usage"] = usage_json(*usage);
        return dump(j);
    }
    j["choices"] =
        json::array({{{"index", 0},
                      {"text", text},
                      {"logprobs", text_logprobs_json(logprobs, text_offset)},
                      {"finish_reason", finish_reason.empty() ? json() : json(finish_reason)}}});
    return dump(j);
}

}  // namespace deltaserve::api
