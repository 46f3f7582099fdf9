// The OpenAI chat completions protocol: request parsing with validation, and the JSON of
// answers, stream chunks and errors, as vLLM and llama.cpp's server speak it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "deltaserve/common/status.h"
#include "deltaserve/model/chat_template.h"
#include "deltaserve/model/sampler.h"
#include "deltaserve/model/tool_calls.h"

namespace deltaserve::api {

// Limits of a request (each a 400 naming what is over it).
inline constexpr int kMaxJsonDepth = 32;            // nesting of objects and arrays
inline constexpr size_t kMaxJsonElements = 65536;   // values in objects and arrays, in all
inline constexpr size_t kMaxMessages = 4096;        // messages in one request
inline constexpr size_t kMaxStopStrings = 4;        // as OpenAI
inline constexpr size_t kMaxStopBytes = 1024;       // bytes of one stop string
inline constexpr size_t kMaxModelNameBytes = 256;   // bytes of the model field
inline constexpr size_t kMaxSessionIdBytes = 128;   // bytes of a session id
inline constexpr size_t kMaxTools = 128;            // tools, and tool calls in one message
inline constexpr size_t kMaxToolNameBytes = 64;     // a function's name (as OpenAI)
inline constexpr size_t kMaxToolCallIdBytes = 256;  // a tool call's id, a message's name
inline constexpr int32_t kMaxChoices = 16;          // n: choices of one request

// A session id: 1 to 128 characters of [A-Za-z0-9._:-], so it can go into a header, a log
// line or a URL path as it is. kInvalidArgument naming `field` otherwise.
Status check_session_id(std::string_view id, std::string_view field);

struct ChatRequest {
    std::string model;  // as the client named it ("" = the served one)
    std::vector<model::ChatMessage> messages;
    model::SamplingParams sampling;  // temperature, top_p, top_k, min_p, repetition_penalty
    bool seed_given = false;
    int32_t max_tokens = -1;  // max_tokens or max_completion_tokens; -1 = until the context is full
    std::vector<std::string> stop;  // up to 4 stop strings (not part of the answer)
    bool stream = false;
    bool include_usage = false;  // stream_options.include_usage: a last chunk with usage
    std::string session_id;      // the session_id field (the X-Session-ID header also works)
    // expected_turn: the turns the client knows its session to hold (its last answer's
    // session_turn); a session at another turn answers 409 session_turn_mismatch, and one
    // whose history was marked lost (deltactl repair) goes on only when this matches.
    // -1: not given.
    int32_t expected_turn = -1;
    std::string tenant;  // who asks (from the API key, never from the body)
    // chat_template_kwargs (as vLLM takes it): a JSON object of extra variables for the
    // model's chat template (enable_thinking ...); "" when not given. A session's turn uses
    // its own request's.
    std::string chat_template_kwargs;
    // tools: the functions the model may call, a JSON array of {"type": "function",
    // "function": {"name", "description", "parameters"}} in the request's key order, as the
    // chat template shows them to the model; "" when none, or when tool_choice is "none"
    // (the tools are then not shown, and the answer is not looked at for calls).
    std::string tools_json;
    bool parse_tool_calls = false;  // tools given, tool_choice not none
    // tool_choice "required" (any of the tools) or a named function (forced_tool_name): the
    // answer is one call, enforced while decoding (forced_tool_call.h).
    bool force_tool_call = false;
    std::string forced_tool_name;
    bool parallel_tool_calls = true;  // false: the first call of an answer only
    // Structured output (response_format json_object / json_schema, or the peers' fields):
    // the JSON Schema the answer must be a value of, compact; "" for free text.
    std::string json_schema;
    // logprobs true: each answer token's log-probability, with top_logprobs (0..20) most
    // likely tokens at its place; -1: logprobs false or left out.
    int32_t top_logprobs = -1;
    // The prompt's tokens' log-probabilities with this many most likely tokens at each place
    // (completions' echo with logprobs, vLLM's prompt_logprobs); -1: not asked for. The
    // whole prompt is then computed again (decode::TurnSpec::prompt_logprobs).
    int32_t prompt_logprobs = -1;
    // n: this many choices (1..kMaxChoices), sharing the prompt's KV (choices_runner.h);
    // not streamed, and never a session's turn.
    int32_t n = 1;
    // A text completion (POST /v1/completions): the prompt as it is, not a chat. The engine
    // tokenizes prompt_text (control tokens written in it parsed, BOS as the model adds it),
    // or takes prompt_ids (checked against the vocabulary). No session, no template.
    bool raw_prompt = false;
    std::string prompt_text;
    std::vector<int32_t> prompt_ids;
};

// A generated token's log-probabilities as an answer shows them (choices[].logprobs): each
// token as its bytes (its text in `token`, bytes that are not UTF-8 replaced by U+FFFD).
struct LogprobToken {
    std::string bytes;
    float logprob = 0.0f;
    int32_t id = -1;  // the token id (vLLM's prompt_logprobs are keyed by it)
};
struct LogprobEntry {
    LogprobToken chosen;
    std::vector<LogprobToken> top;  // the most likely first
    int32_t rank = 0;               // chosen's place (1 = the most likely); 0 = not known
    bool scored = true;             // false: a prompt's first token (no logprob: null)
};

// Parses a POST /v1/chat/completions body. Errors (kInvalidArgument) name the field:
// malformed JSON, a body over the limits above, no messages, an unknown role, non-text
// content, a field of the wrong JSON type, values out of range (model::validate_sampling),
// n outside 1..kMaxChoices (or above 1 streamed or with a session), a session_id outside
// check_session_id's rules, a tool or tool call not as OpenAI defines it (a tool message without
// tool_call_id, arguments that are not a JSON object), a response_format or tool_choice the engine
// cannot enforce. Unknown fields are ignored, as the peers do. Never throws. Sampling fields not
// given keep the server's defaults (its --temperature etc. flags, as llama.cpp's server does).
Result<ChatRequest> parse_chat_request(std::string_view body,
                                       const model::SamplingParams& defaults);

struct Usage {
    int32_t prompt_tokens = 0;
    int32_t completion_tokens = 0;
    int32_t cached_tokens = 0;  // prompt tokens found in the session's KV cache
    // Where their KV came from (decode::TurnEnd::kv_source): "decode", "host", "disk",
    // "prefix"; "" when none was cached. usage.prompt_tokens_details.kv_source, and the
    // X-KV-Source header of a whole answer.
    std::string kv_source;
};

// A session turn's fields in its answer: session_turn, the turns the session holds now (the
// next request's expected_turn), and session_stored, false when its record could not be
// written to disk (the session goes on in memory, and may not survive a restart).
struct SessionAnswer {
    int32_t turn = -1;  // -1: not a session turn
    bool stored = true;
};

// A whole answer (chat.completion): its message's content (null when it is empty and the
// answer called tools), tool_calls (each call's id as the server gave it) and logprobs
// ({"content": [...]} as OpenAI writes them; null when not asked for).
std::string completion_json(const std::string& id, int64_t created, const std::string& model,
                            const std::string& text, const std::string& finish_reason,
                            const Usage& usage, const std::string& session_id,
                            const SessionAnswer& session = {},
                            const std::vector<model::ToolCall>& tool_calls = {},
                            const std::vector<LogprobEntry>* logprobs = nullptr);

// One streamed chunk (chat.completion.chunk): the role in the first, then content pieces,
// then the finish reason; usage alone in the last when asked for. logprobs: those of the
// tokens since the last chunk (null when not asked for).
std::string chunk_json(const std::string& id, int64_t created, const std::string& model,
                       const std::optional<std::string>& content, bool first,
                       const std::string& finish_reason, const std::optional<Usage>& usage,
                       const SessionAnswer& session = {},
                       const std::vector<LogprobEntry>* logprobs = nullptr);

// A tool call streamed as OpenAI streams it (delta.tool_calls[0], its index in the answer):
// part 0 names it ({index, id, type, function: {name, arguments: ""}}), part 1 gives its
// arguments ({index, function: {arguments}}).
std::string tool_call_chunk_json(const std::string& id, int64_t created, const std::string& model,
                                 int index, const model::ToolCall& call, int part, bool first);

// {"error": {"message", "type", "param", "code"}}: type invalid_request_error (400),
// not_found_error (404), server_error (500), ...; code is `code` when given (OpenAI's
// strings, e.g. "session_not_found"), else the HTTP status (as vLLM).
std::string error_json(const std::string& message, const std::string& type, int status,
                       const std::string& code = "");

}  // namespace deltaserve::api
