// The text of an answer's tokens as logprobs show them: each token's bytes where it stands
// (after the token before it: a SentencePiece word's space), control tokens by name.
#pragma once

#include <cstdint>

#include "deltaserve/api/openai_protocol.h"
#include "deltaserve/model/token_logprobs.h"
#include "deltaserve/model/tokenizer.h"

namespace deltaserve::api {

class TokenTexts {
  public:
    // prev: the token before the answer's first (the prompt's last).
    TokenTexts(const model::Tokenizer& tokenizer, int32_t prev) : tok_(tokenizer), prev_(prev) {}

    // The next answer token's entry (ids checked by model::check_token_logprobs).
    LogprobEntry entry(const model::TokenLogprobs& lp) {
        LogprobEntry e;
        e.chosen = {tok_.token_to_piece(lp.chosen.token, prev_, true), lp.chosen.logprob,
                    lp.chosen.token};
        for (const model::TokenLogprob& t : lp.top)
            e.top.push_back({tok_.token_to_piece(t.token, prev_, true), t.logprob, t.token});
        e.rank = lp.rank;
        prev_ = lp.chosen.token;
        return e;
    }
    // A prompt's first token, which nothing scores (its entry shows null).
    static LogprobEntry unscored(const model::Tokenizer& tokenizer, int32_t token) {
        LogprobEntry e;
        e.chosen = {tokenizer.token_to_piece(token, -1, true), 0.0f, token};
        e.scored = false;
        return e;
    }

  private:
    const model::Tokenizer& tok_;
    int32_t prev_;
};

}  // namespace deltaserve::api
