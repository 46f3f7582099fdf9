// A generated token's log-probability and the most likely tokens at its place, as OpenAI's
// `logprobs` / `top_logprobs` return them: from the model's own distribution (the log-softmax
// of the raw logits, before penalties, temperature or a response format's mask), as vLLM
// and OpenAI report them. And the few bytes that carry them between nodes.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "deltaserve/common/status.h"

namespace deltaserve::model {

constexpr int32_t kMaxTopLogprobs = 20;  // OpenAI's limit on top_logprobs

struct TokenLogprob {
    int32_t token = -1;
    float logprob = 0.0f;
};

struct TokenLogprobs {
    TokenLogprob chosen;
    std::vector<TokenLogprob> top;  // the most likely first (ties: the lower id), n_top of them
    // The chosen token's place in that order (1 = the most likely); 0 = not known (the few
    // bytes between nodes leave it out: only a prompt's log-probabilities show it).
    int32_t rank = 0;
};

// The chosen token's log-probability in a row of logits and its n_top (0..kMaxTopLogprobs)
// most likely tokens, and its rank. Two passes over the row (plus one for the top tokens).
TokenLogprobs token_logprobs(std::span<const float> logits, int32_t chosen, int32_t n_top);

// Log-probabilities from a peer: kInvalidArgument for more than kMaxTopLogprobs top tokens,
// a token outside [0, n_vocab), a logprob above 0 or not a number.
Status check_token_logprobs(const TokenLogprobs& lp, int32_t n_vocab);

// A compact encoding (little-endian: count, then token and logprob of the chosen token and
// each top one): at most 172 bytes.
std::string encode_token_logprobs(const TokenLogprobs& lp);
// Errors: kInvalidArgument for a truncated or oversized encoding, and check_token_logprobs'.
Result<TokenLogprobs> decode_token_logprobs(std::string_view bytes, int32_t n_vocab);

}  // namespace deltaserve::model
