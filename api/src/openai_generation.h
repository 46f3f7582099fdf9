// The fields chat and text completions share: sampling (temperature, top_p, top_k, min_p,
// repetition_penalty, presence_penalty, frequency_penalty, seed), max_tokens, n (1 to
// kMaxChoices, not streamed), stop, stream and stream_options, each checked as OpenAI defines it;
// and what their answers share (usage, the JSON text).
#pragma once

#include <string>
#include <vector>

#include "deltaserve/api/openai_protocol.h"

#include "json_fields.h"

namespace deltaserve::api {

// Into r (its sampling starts as the server's defaults). Errors name the field.
Status parse_generation_fields(const RequestJson& j, ChatRequest& r);

// {prompt_tokens, completion_tokens, total_tokens, prompt_tokens_details: {cached_tokens,
// kv_source}}.
RequestJson usage_json(const Usage& u);
// An answer's JSON text; bytes that are not UTF-8 (a token's part of a character) replaced.
std::string dump(const RequestJson& j);

// One answer of n choices from each choice's own whole answer (chat.completion or
// text_completion, as this server wrote them): the first's, with every answer's choice at
// its index and the choices' completion tokens summed in usage (the prompt counted once).
std::string merge_choices(const std::vector<std::string>& answers);

}  // namespace deltaserve::api
