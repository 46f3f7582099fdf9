// One chat turn as the decode worker runs it: what to generate, where the text goes, and how
// it ended. Shared by the decode and prefill workers and the gateway's engines.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "deltaserve/common/status.h"
#include "deltaserve/model/sampler.h"
#include "deltaserve/model/token_logprobs.h"

namespace deltaserve::decode {

struct TurnSpec {
    uint64_t turn_id = 0;            // unique per gateway (it names the turn's KV stream)
    std::string session_id;          // "" = nothing is kept after the turn
    std::vector<int32_t> tokens;     // the whole prompt: history, then the new messages
    model::SamplingParams sampling;  // seed already chosen
    int32_t max_tokens = -1;         // -1 = up to the context size
    std::vector<std::string> stop;   // stop strings (not part of the answer)
    // Whose cached prefixes the turn may use and add to (the tenant): KV computed for one
    // scope is never found by another's prompts. "" = the scope of all turns without one.
    std::string cache_scope;
    // Control tokens whose text the answer shows (at most 16): the markers of the model's
    // tool calls, e.g. <|python_tag|> or [TOOL_CALLS], for the gateway to find them. Other
    // control tokens are left out of the text, as before.
    std::vector<int32_t> shown_tokens;
    // Structured output: the answer is a JSON value of this JSON Schema (text), enforced
    // token by token (model/json_schema_grammar.h); "" = free text. The turn ends "stop" once
    // the value is whole and nothing can follow it.
    std::string json_schema;
    // Literal text before and after that value (a forced tool call's markers); "" = none.
    std::string json_prefix, json_suffix;
    // Each generated token's log-probability and this many most likely tokens at its place
    // (0..model::kMaxTopLogprobs), to TurnSink::on_logprobs; -1 = none.
    int32_t logprobs = -1;
    // The prompt's log-probabilities: each prompt token after the first, with this many most
    // likely tokens at its place (0..model::kMaxTopLogprobs), to TurnSink::on_logprobs in
    // prompt order before any generated token's; -1 = none. The whole prompt is then computed
    // on the decode node (no cached prefix, session KV or prefill node: none keeps logits).
    int32_t prompt_logprobs = -1;
    // A turn continued here after the node running it was lost (the gateway moves it): the
    // last `continued` tokens of `tokens` are its answer so far, and the first
    // `continued_sent` bytes of their text reached the client already. The worker prefills
    // the prompt before them and replays them as decode steps, as the lost node computed
    // them, so the answer goes on as it would have there: sampling (the random stream, the
    // penalties), the response format and the stop strings included. TurnEnd's text and
    // completion_tokens count them too, and max_tokens is the whole answer's. A prefill node
    // gets the prompt alone (continued 0).
    int32_t continued = 0;
    int32_t continued_sent = 0;
};

struct TurnEnd {
    std::string finish_reason;  // "stop", "length" or "cancelled"
    std::string text;           // the answer, stop string cut off
    int32_t prompt_tokens = 0;
    int32_t cached_tokens = 0;  // prompt tokens whose KV was already held (not prefilled)
    int32_t completion_tokens = 0;
    // Where the cached tokens' KV came from: "decode" (the session's, in decode memory),
    // "host" or "disk" (the session's, brought back from that tier of the store), "prefix"
    // (the prefix cache); "" when nothing was cached.
    std::string kv_source;
};

// Where a turn's text goes. Called from the decode worker's threads, never concurrently for
// one turn.
class TurnSink {
  public:
    virtual ~TurnSink() = default;
    // A piece of the answer (whole UTF-8 characters); returning false cancels the turn.
    virtual bool on_piece(std::string_view piece) = 0;
    // A generated token's log-probabilities (TurnSpec::logprobs), before the piece that
    // holds its text (which may come with a later token's, or be cut as a stop string), and
    // the end-of-turn token's (which has no text) when the turn ends on one; first,
    // with TurnSpec::prompt_logprobs, the prompt's tokens' after the first, in order.
    virtual void on_logprobs(const model::TokenLogprobs& lp) { (void)lp; }
    // Each generated token's id (not the end-of-turn token's), in order: after its
    // log-probabilities, before the piece that holds its text. What a gateway needs to
    // continue the turn elsewhere (TurnSpec::continued).
    virtual void on_token(int32_t token) { (void)token; }
    // The prompt's KV is in, and in the prefix cache where the worker keeps one: turns that
    // share the prompt (the choices of one request) can start now and adopt its blocks.
    // Once, before the turn's first piece; never for a turn that failed before it.
    virtual void on_prompt_done() {}
    // The turn ended: how, or why it failed. Called exactly once, after the last piece.
    virtual void on_end(Result<TurnEnd> end) = 0;
};

}  // namespace deltaserve::decode
