#include "deltaserve/model/token_logprobs.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace deltaserve::model {

namespace {

// A token ahead of another in the top list: the larger logit, then the lower id.
bool ahead(float la, int32_t a, float lb, int32_t b) { return la > lb || (la == lb && a < b); }

void put_u32(std::string& out, uint32_t v) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint32_t get_u32(std::string_view in, size_t at) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i)
        v |= static_cast<uint32_t>(static_cast<uint8_t>(in[at + i])) << (8 * i);
    return v;
}

void put_entry(std::string& out, const TokenLogprob& e) {
    put_u32(out, static_cast<uint32_t>(e.token));
    uint32_t bits = 0;
    std::memcpy(&bits, &e.logprob, sizeof bits);
    put_u32(out, bits);
}

TokenLogprob get_entry(std::string_view in, size_t at) {
    TokenLogprob e;
    e.token = static_cast<int32_t>(get_u32(in, at));
    const uint32_t bits = get_u32(in, at + 4);
    std::memcpy(&e.logprob, &bits, sizeof bits);
    return e;
}

Status check_entry(const TokenLogprob& e, int32_t n_vocab) {
    if (e.token < 0 || e.token >= n_vocab) {
        return invalid_argument("logprobs: token " + std::to_string(e.token) +
                                " is outside the vocabulary");
    }
    if (!(e.logprob <= 0.0f)) return invalid_argument("logprobs: a log-probability above 0");
    return {};
}

}  // namespace

TokenLogprobs token_logprobs(std::span<const float> logits, int32_t chosen, int32_t n_top) {
    const int32_t n = static_cast<int32_t>(logits.size());
    n_top = std::clamp(n_top, 0, std::min(kMaxTopLogprobs, n));
    float max = -std::numeric_limits<float>::infinity();
    for (float x : logits) max = std::max(max, x);
    double sum = 0.0;
    for (float x : logits) sum += std::exp(static_cast<double>(x) - max);
    const double log_z = static_cast<double>(max) + std::log(sum);
    const auto logprob = [&](int32_t t) {
        return static_cast<float>(std::min(0.0, static_cast<double>(logits[t]) - log_z));
    };
    TokenLogprobs out;
    out.chosen = {chosen, chosen >= 0 && chosen < n ? logprob(chosen) : 0.0f};
    if (chosen >= 0 && chosen < n) {
        out.rank = 1;
        for (int32_t t = 0; t < n; ++t) out.rank += ahead(logits[t], t, logits[chosen], chosen);
    }
    // The n_top largest, kept sorted: a token enters when it beats the last kept.
    std::vector<int32_t> top;
    top.reserve(static_cast<size_t>(n_top) + 1);
    for (int32_t t = 0; t < n && n_top > 0; ++t) {
        if (static_cast<int32_t>(top.size()) == n_top &&
            !ahead(logits[t], t, logits[top.back()], top.back())) {
            continue;
        }
        auto at = std::find_if(top.begin(), top.end(),
                               [&](int32_t k) { return ahead(logits[t], t, logits[k], k); });
        top.insert(at, t);
        if (static_cast<int32_t>(top.size()) > n_top) top.pop_back();
    }
    for (int32_t t : top) out.top.push_back({t, logprob(t)});
    return out;
}

Status check_token_logprobs(const TokenLogprobs& lp, int32_t n_vocab) {
    if (lp.top.size() > static_cast<size_t>(kMaxTopLogprobs)) {
        return invalid_argument("logprobs: " + std::to_string(lp.top.size()) +
                                " top tokens (at most " + std::to_string(kMaxTopLogprobs) + ")");
    }
    DS_RETURN_IF_ERROR(check_entry(lp.chosen, n_vocab));
    if (lp.rank < 0 || lp.rank > n_vocab)
        return invalid_argument("logprobs: rank " + std::to_string(lp.rank) + " is not a place");
    for (const TokenLogprob& e : lp.top) DS_RETURN_IF_ERROR(check_entry(e, n_vocab));
    return {};
}

std::string encode_token_logprobs(const TokenLogprobs& lp) {
    std::string out;
    const size_t n = std::min(lp.top.size(), static_cast<size_t>(kMaxTopLogprobs));
    put_u32(out, static_cast<uint32_t>(n));
    put_entry(out, lp.chosen);
    for (size_t i = 0; i < n; ++i) put_entry(out, lp.top[i]);
    return out;
}

Result<TokenLogprobs> decode_token_logprobs(std::string_view bytes, int32_t n_vocab) {
    if (bytes.size() < 12) return invalid_argument("logprobs: a truncated encoding");
    const uint32_t n = get_u32(bytes, 0);
    if (n > static_cast<uint32_t>(kMaxTopLogprobs)) {
        return invalid_argument("logprobs: " + std::to_string(n) + " top tokens (at most " +
                                std::to_string(kMaxTopLogprobs) + ")");
    }
    if (bytes.size() != 12 + 8 * static_cast<size_t>(n)) {
        return invalid_argument("logprobs: an encoding of " + std::to_string(bytes.size()) +
                                " bytes for " + std::to_string(n) + " top tokens");
    }
    TokenLogprobs lp;
    lp.chosen = get_entry(bytes, 4);
    for (uint32_t i = 0; i < n; ++i) lp.top.push_back(get_entry(bytes, 12 + 8 * size_t{i}));
    DS_RETURN_IF_ERROR(check_token_logprobs(lp, n_vocab));
    return lp;
}

}  // namespace deltaserve::model
