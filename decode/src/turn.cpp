#include "deltaserve/decode/turn.h"

#include <algorithm>

namespace deltaserve::decode {

void prime_sampler(model::Sampler& sampler, const TurnSpec& spec) {
    const size_t answer =
        std::min(spec.tokens.size(), static_cast<size_t>(std::max(spec.continued, 0)));
    const size_t prompt = spec.tokens.size() - answer;
    for (size_t i = 0; i < prompt; ++i) sampler.accept(spec.tokens[i]);
    for (size_t i = prompt; i < spec.tokens.size(); ++i) {
        sampler.accept_generated(spec.tokens[i]);
        sampler.skip_sample();
    }
}

Status replay_continued(model::TokenConstraint& constraint, const TurnSpec& spec) {
    const size_t first = spec.tokens.size() - static_cast<size_t>(std::max(spec.continued, 0));
    for (size_t i = first; i < spec.tokens.size(); ++i) {
        if (!constraint.accept(spec.tokens[i])) {
            return invalid_argument("a continued turn's answer so far breaks its response format");
        }
    }
    return Status();
}

}  // namespace deltaserve::decode
