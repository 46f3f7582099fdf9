// OpenAI's text completions (POST /v1/completions, as vLLM and llama-server serve it): the
// request (a text or token-id prompt, echo, logprobs as a count) and the text_completion
// answers, whole and streamed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "deltaserve/api/openai_protocol.h"

namespace deltaserve::api {

struct CompletionRequest {
    ChatRequest turn;   // raw_prompt set; max_tokens 16 unless given (OpenAI's default)
    bool echo = false;  // the answer's text starts with the prompt's
    // The prompt's scores as the answer shows them (turn.prompt_logprobs the larger):
    // echo with logprobs puts them first in `logprobs` (echoed_top most likely tokens each),
    // vLLM's prompt_logprobs in choices[0].prompt_logprobs (listed_top each). -1: not shown.
    int32_t echoed_top = -1;
    int32_t listed_top = -1;
};

// What an answer shows of its prompt's scores (CompletionRequest's fields).
struct PromptScores {
    const std::vector<LogprobEntry>* entries = nullptr;  // TurnResult::prompt_logprobs
    int32_t echoed_top = -1;
    int32_t listed_top = -1;
};

// Errors (kInvalidArgument) name the field: prompt missing, empty, not a string or a list
// of token ids (or a list holding one of them; more prompts in one request are refused),
// ids outside [0, 2^31); suffix, best_of > 1, logit_bias, and streaming the prompt's
// logprobs are refused by name; the shared fields as chat's (openai_generation.h).
Result<CompletionRequest> parse_completion_request(std::string_view body,
                                                   const model::SamplingParams& defaults);

// A whole answer (text_completion): choices[0].text (after the echoed prompt, if any),
// finish_reason, logprobs ({tokens, token_logprobs, top_logprobs, text_offset}, null when
// not asked for; the echoed prompt's tokens first, the first of them null),
// prompt_logprobs as vLLM gives them ([null, {"<id>": {logprob, rank, decoded_token}}...])
// and usage.
std::string text_completion_json(const std::string& id, int64_t created, const std::string& model,
                                 const std::string& text, const std::string& finish_reason,
                                 const Usage& usage, const std::vector<LogprobEntry>* logprobs,
                                 size_t text_offset, const PromptScores& prompt = {});

// One streamed chunk: a piece of text (its tokens' logprobs, their offsets from
// text_offset), or the finish reason, or usage alone.
std::string text_completion_chunk_json(const std::string& id, int64_t created,
                                       const std::string& model, const std::string& text,
                                       const std::string& finish_reason,
                                       const std::optional<Usage>& usage,
                                       const std::vector<LogprobEntry>* logprobs,
                                       size_t text_offset);

}  // namespace deltaserve::api
