#include "openai_generation.h"

#include <climits>

namespace deltaserve::api {

namespace {

using json = RequestJson;

Status parse_stop_field(const json& j, std::vector<std::string>& out) {
    const json* s = field_of(j, "stop");
    if (s == nullptr) return Status();
    const std::string must =
        "must be a string or an array of up to " + std::to_string(kMaxStopStrings) + " strings";
    if (s->is_string()) {
        out.push_back(s->get<std::string>());
    } else if (s->is_array() && s->size() <= kMaxStopStrings) {
        for (const json& x : *s) {
            if (!x.is_string()) return bad_field("stop", must);
            out.push_back(x.get<std::string>());
        }
    } else {
        return bad_field("stop", must);
    }
    for (const std::string& x : out) {
        if (x.empty()) return bad_field("stop", "must not hold an empty string");
        if (x.size() > kMaxStopBytes)
            return bad_field(
                "stop", "holds a string longer than " + std::to_string(kMaxStopBytes) + " bytes");
    }
    return Status();
}

}  // namespace

Status parse_generation_fields(const RequestJson& j, ChatRequest& r) {
    DS_RETURN_IF_ERROR(number_field(j, "temperature", r.sampling.temperature));
    DS_RETURN_IF_ERROR(number_field(j, "top_p", r.sampling.top_p));
    DS_RETURN_IF_ERROR(number_field(j, "min_p", r.sampling.min_p));
    DS_RETURN_IF_ERROR(number_field(j, "repetition_penalty", r.sampling.repeat_penalty));
    DS_RETURN_IF_ERROR(number_field(j, "presence_penalty", r.sampling.presence_penalty));
    DS_RETURN_IF_ERROR(number_field(j, "frequency_penalty", r.sampling.frequency_penalty));
    int64_t v = 0;
    bool given = false;
    DS_RETURN_IF_ERROR(integer_field(j, "top_k", -1, 1 << 20, v, given));
    if (given) r.sampling.top_k = static_cast<int32_t>(v < 0 ? 0 : v);  // -1: off, as vLLM
    DS_RETURN_IF_ERROR(model::validate_sampling(r.sampling));
    DS_RETURN_IF_ERROR(integer_field(j, "seed", INT64_MIN, INT64_MAX, v, given));
    if (given) {
        r.sampling.seed = static_cast<uint64_t>(v);
        r.seed_given = true;
    }
    DS_RETURN_IF_ERROR(integer_field(j, "max_tokens", 1, 1 << 30, v, given));
    if (given) r.max_tokens = static_cast<int32_t>(v);
    DS_RETURN_IF_ERROR(integer_field(j, "n", 1, kMaxChoices, v, given));
    if (given) r.n = static_cast<int32_t>(v);
    DS_RETURN_IF_ERROR(parse_stop_field(j, r.stop));
    DS_RETURN_IF_ERROR(boolean_field(j, "stream", "stream", r.stream));
    if (r.n > 1 && r.stream) return bad_field("n", "above 1 is not streamed; set stream false");
    if (const json* so = field_of(j, "stream_options")) {
        if (!so->is_object()) return bad_field("stream_options", "must be an object");
        DS_RETURN_IF_ERROR(
            boolean_field(*so, "include_usage", "stream_options.include_usage", r.include_usage));
    }
    return Status();
}

RequestJson usage_json(const Usage& u) {
    json details = {{"cached_tokens", u.cached_tokens}};
    if (!u.kv_source.empty()) details["kv_source"] = u.kv_source;
    return {{"prompt_tokens", u.prompt_tokens},
            {"completion_tokens", u.completion_tokens},
            {"total_tokens", u.prompt_tokens + u.completion_tokens},
            {"prompt_tokens_details", details}};
}

std::string dump(const RequestJson& j) {
    return j.dump(-1, ' ', false, RequestJson::error_handler_t::replace);
}

std::string merge_choices(const std::vector<std::string>& answers) {
    json out = json::parse(answers.at(0));
    json choices = json::array();
    int64_t completion = 0;
    for (size_t i = 0; i < answers.size(); ++i) {
        json a = json::parse(answers[i]);
        json c = a["choices"][0];
        c["index"] = i;
        choices.push_back(std::move(c));
        completion += a["usage"]["completion_tokens"].get<int64_t>();
    }
    out["choices"] = std::move(choices);
    out["usage"]["completion_tokens"] = completion;
    out["usage"]["total_tokens"] = out["usage"]["prompt_tokens"].get<int64_t>() + completion;
    return dump(out);
}

}  // namespace deltaserve::api
