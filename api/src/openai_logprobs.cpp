#include "openai_logprobs.h"

#include <cmath>
#include <string>

#include "deltaserve/model/token_logprobs.h"

namespace deltaserve::api {

namespace {

using json = RequestJson;

// A log-probability as JSON: a number, -9999 for a token the model rules out (as vLLM).
double logprob_value(float lp) { return std::isfinite(lp) ? lp : -9999.0; }

json bytes_json(const std::string& bytes) {
    json out = json::array();
    for (char c : bytes) out.push_back(static_cast<uint8_t>(c));
    return out;
}

json token_json(const LogprobToken& t) {
    // The text is written with invalid UTF-8 replaced (the dump's error handler); the bytes
    // are exact, so a token that is part of a character is not lost.
    return {
        {"token", t.bytes}, {"logprob", logprob_value(t.logprob)}, {"bytes", bytes_json(t.bytes)}};
}

}  // namespace

Status parse_logprobs_fields(const RequestJson& j, int32_t& top) {
    top = -1;
    bool wanted = false;
    DS_RETURN_IF_ERROR(boolean_field(j, "logprobs", "logprobs", wanted));
    int64_t n = 0;
    bool given = false;
    DS_RETURN_IF_ERROR(integer_field(j, "top_logprobs", 0, model::kMaxTopLogprobs, n, given));
    if (given && n > 0 && !wanted) return bad_field("top_logprobs", "needs logprobs set to true");
    if (wanted) top = given ? static_cast<int32_t>(n) : 0;
    return Status();
}

RequestJson chat_logprobs_json(const std::vector<LogprobEntry>* entries) {
    if (entries == nullptr) return nullptr;
    json content = json::array();
    for (const LogprobEntry& e : *entries) {
        json entry = token_json(e.chosen);
        json top = json::array();
        for (const LogprobToken& t : e.top) top.push_back(token_json(t));
        entry["top_logprobs"] = std::move(top);
        content.push_back(std::move(entry));
    }
    return {{"content", std::move(content)}, {"refusal", nullptr}};
}

}  // namespace deltaserve::api
