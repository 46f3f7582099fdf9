// Token sampling: repetition penalty, top-k, top-p, min-p, temperature, seeded RNG, in
// llama.cpp's order. Temperature 0 is greedy (the lowest id wins a tie).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

#include "deltaserve/common/status.h"

namespace deltaserve::model {

struct SamplingParams {
    float temperature = 0.8f;     // Default 0.8; 0 = greedy
    int32_t top_k = 40;           // Default 40; 0 = off
    float top_p = 0.95f;          // Default 0.95; 1 = off
    float min_p = 0.05f;          // Default 0.05; 0 = off
    float repeat_penalty = 1.0f;  // Default 1.0 = off
    int32_t repeat_last_n = 64;   // Default 64 tokens penalised
    // OpenAI's penalties on the tokens generated so far (not the prompt's): each logit less
    // frequency_penalty x the token's count and presence_penalty once it has come. Default 0.
    float presence_penalty = 0.0f;
    float frequency_penalty = 0.0f;
    uint64_t seed = 0;  // Default: the caller picks (random unless given)
};

// The one check of sampling values from outside (HTTP, RPC, flags): kInvalidArgument naming
// the field (OpenAI's names) unless temperature is in [0, 2], top_p in (0, 1], min_p in
// [0, 1], top_k in [0, 2^20], repetition_penalty in (0, 10], repeat_last_n in [0, 2^20],
// presence_penalty and frequency_penalty in [-2, 2]; NaN is out of every range.
Status validate_sampling(const SamplingParams& params);

class Sampler {
  public:
    explicit Sampler(const SamplingParams& params);

    // Picks the next token from n_vocab logits.
    int32_t sample(std::span<const float> logits);

    // sample() among the tokens `allowed` lets through (bit i % 64 of word i / 64 for token
    // i), as constrained decoding masks a row: the other tokens are never picked, the filters
    // and the draw see only these. -1 when it lets none through.
    int32_t sample(std::span<const float> logits, std::span<const uint64_t> allowed);

    // Sampling from a row's largest logits only (a device backend's top_k), for rows too
    // large to bring over whole. What sample() needs of a row: its candidates_wanted()
    // largest logits (ties: the lower id first) and the logits of the tokens penalized()
    // names; 0 wanted: the whole row (top_k off at a temperature above 0).
    int32_t candidates_wanted() const;
    // The tokens the penalties change, sorted; none when they are off.
    std::vector<int32_t> penalized() const;
    // sample() from those: ids and logits of the row's largest (at least candidates_wanted()
    // of them, or the whole row) and of the penalized tokens, in any order, an id given twice
    // the same logit. The same pick, and the same draws, as sample() on the whole row.
    int32_t sample_candidates(std::span<const int32_t> ids, std::span<const float> logits);
    // Records a token of the sequence (prompt or generated) for the repetition penalty.
    void accept(int32_t token);
    // Records a generated token: accept(), and its count for the presence and frequency
    // penalties.
    void accept_generated(int32_t token);
    // Advances the random stream as one sample() does, for a sequence whose token was
    // sampled elsewhere (a prefill node samples the first token, a decode node the rest).
    void skip_sample();
    void reset();

    const SamplingParams& params() const { return params_; }

  private:
    struct Candidate {
        int32_t id;
        float logit;
    };
    // The rest of a sample once cand_ holds the candidates in id order, penalized.
    int32_t pick();
    SamplingParams params_;
    std::mt19937_64 rng_;
    // The penalties on one token's logit.
    float penalize(int32_t id, float logit) const;
    std::deque<int32_t> recent_;                      // the repetition penalty's window
    std::unordered_map<int32_t, int32_t> in_window_;  // count of each token in it
    std::map<int32_t, int32_t> generated_;            // count of each generated token
    std::vector<Candidate> cand_;
};

// argmax over logits; the first maximum wins.
int32_t greedy(std::span<const float> logits);

}  // namespace deltaserve::model
