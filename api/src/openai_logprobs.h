// OpenAI's logprobs: the request fields (logprobs, top_logprobs) and the answer's
// choices[].logprobs object, for chat (content: one entry per token, each with its
// top_logprobs).
#pragma once

#include <cstdint>
#include <vector>

#include "deltaserve/api/openai_protocol.h"
#include "deltaserve/common/status.h"
#include "json_fields.h"

namespace deltaserve::api {

// logprobs (true or false) and top_logprobs (0..20, only with logprobs true, as OpenAI
// has it): top is -1 without logprobs, else the count of top tokens. Errors name the field.
Status parse_logprobs_fields(const RequestJson& j, int32_t& top);

// {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}],
// "refusal": null}; null when entries is null (not asked for).
RequestJson chat_logprobs_json(const std::vector<LogprobEntry>* entries);

}  // namespace deltaserve::api
