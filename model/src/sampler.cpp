#include "deltaserve/model/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace deltaserve::model {

namespace {

Status out_of(const char* field, double lo, double hi, bool lo_open, double v) {
    const bool in = lo_open ? v > lo && v <= hi : v >= lo && v <= hi;  // false for NaN
    if (in) return Status();
    char buf[160];
    std::snprintf(buf, sizeof buf, "'%s' must be in %c%.10g, %.10g], not %.10g", field,
                  lo_open ? '(' : '[', lo, hi, v);
    return invalid_argument(buf);
}

}  // namespace

Status validate_sampling(const SamplingParams& p) {
    constexpr double kMaxCount = 1 << 20;
    DS_RETURN_IF_ERROR(out_of("temperature", 0, 2, false, p.temperature));
    DS_RETURN_IF_ERROR(out_of("top_p", 0, 1, true, p.top_p));
    DS_RETURN_IF_ERROR(out_of("min_p", 0, 1, false, p.min_p));
    DS_RETURN_IF_ERROR(out_of("top_k", 0, kMaxCount, false, p.top_k));
    DS_RETURN_IF_ERROR(out_of("repetition_penalty", 0, 10, true, p.repeat_penalty));
    DS_RETURN_IF_ERROR(out_of("repeat_last_n", 0, kMaxCount, false, p.repeat_last_n));
    DS_RETURN_IF_ERROR(out_of("presence_penalty", -2, 2, false, p.presence_penalty));
    DS_RETURN_IF_ERROR(out_of("frequency_penalty", -2, 2, false, p.frequency_penalty));
    return Status();
}

int32_t greedy(std::span<const float> logits) {
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

void Sampler::accept(int32_t token) {
    if (params_.repeat_last_n <= 0) return;
    recent_.push_back(token);
    ++in_window_[token];
    if (static_cast<int32_t>(recent_.size()) > params_.repeat_last_n) {
        auto it = in_window_.find(recent_.front());
        if (--it->second == 0) in_window_.erase(it);
        recent_.pop_front();
    }
}

void Sampler::accept_generated(int32_t token) {
    accept(token);
    if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) ++generated_[token];
}

void Sampler::reset() {
    recent_.clear();
    in_window_.clear();
    generated_.clear();
    rng_.seed(params_.seed);
}

void Sampler::skip_sample() {
    if (params_.temperature <= 0.0f) return;
    std::uniform_real_distribution<double> u(0.0,
                                             1.0);  // the engine calls do not depend on the range
    (void)u(rng_);
}

std::vector<int32_t> Sampler::penalized() const {
    std::vector<int32_t> seen;
    if (params_.repeat_penalty != 1.0f) {
        for (const auto& [id, n] : in_window_) seen.push_back(id);
    }
    for (const auto& [id, n] : generated_) seen.push_back(id);
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    return seen;
}

int32_t Sampler::candidates_wanted() const {
    // After the penalty, the largest k are among the k + |penalized| largest before it and
    // the penalized tokens themselves.
    const auto more = static_cast<int32_t>(penalized().size());
    if (params_.temperature <= 0.0f) return 1 + more;
    return params_.top_k > 0 ? params_.top_k + more : 0;
}

float Sampler::penalize(int32_t id, float l) const {
    // llama.cpp's order: the repetition penalty (on the window), then frequency and presence.
    if (params_.repeat_penalty != 1.0f && in_window_.count(id) != 0) {
        l = l > 0 ? l / params_.repeat_penalty : l * params_.repeat_penalty;
    }
    if (auto it = generated_.find(id); it != generated_.end()) {
        l -= params_.frequency_penalty * static_cast<float>(it->second) + params_.presence_penalty;
    }
    return l;
}

int32_t Sampler::sample(std::span<const float> logits) {
    cand_.resize(logits.size());
    for (size_t i = 0; i < logits.size(); ++i) cand_[i] = {static_cast<int32_t>(i), logits[i]};
    for (int32_t id : penalized()) {
        cand_[id].logit = penalize(id, cand_[id].logit);
    }
    return pick();
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const uint64_t> allowed) {
    cand_.clear();
    for (size_t w = 0; w < allowed.size(); ++w) {
        for (uint64_t bits = allowed[w]; bits != 0; bits &= bits - 1) {
            const size_t id = w * 64 + static_cast<size_t>(__builtin_ctzll(bits));
            if (id >= logits.size()) break;
            cand_.push_back({static_cast<int32_t>(id), logits[id]});
        }
    }
    if (cand_.empty()) return -1;
    // Both in id order.
    auto it = cand_.begin();
    for (int32_t id : penalized()) {
        while (it != cand_.end() && it->id < id) ++it;
        if (it != cand_.end() && it->id == id) it->logit = penalize(id, it->logit);
    }
    return pick();
}

int32_t Sampler::sample_candidates(std::span<const int32_t> ids, std::span<const float> logits) {
    cand_.clear();
    DS_CHECK(!ids.empty() && ids.size() == logits.size(), "sampling from no candidates");
    for (size_t i = 0; i < ids.size(); ++i) cand_.push_back({ids[i], logits[i]});
    const auto by_id = [](const Candidate& a, const Candidate& b) { return a.id < b.id; };
    std::sort(cand_.begin(), cand_.end(), by_id);
    cand_.erase(std::unique(cand_.begin(), cand_.end(),
                            [](const Candidate& a, const Candidate& b) { return a.id == b.id; }),
                cand_.end());
    for (int32_t id : penalized()) {
        auto it = std::lower_bound(cand_.begin(), cand_.end(), Candidate{id, 0.0f}, by_id);
        if (it != cand_.end() && it->id == id) {
            it->logit = penalize(id, it->logit);
        }
    }
    return pick();
}

int32_t Sampler::pick() {
    if (params_.temperature <= 0.0f) {
        auto best = std::max_element(
            cand_.begin(), cand_.end(),
            [](const Candidate& a, const Candidate& b) { return a.logit < b.logit; });
        return best->id;
    }
    auto by_logit = [](const Candidate& a, const Candidate& b) {
        return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
    };
    size_t n = cand_.size();
    if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < n) {
        n = static_cast<size_t>(params_.top_k);
        std::partial_sort(cand_.begin(), cand_.begin() + n, cand_.end(), by_logit);
    } else {
        std::sort(cand_.begin(), cand_.end(), by_logit);
    }
    // Probabilities of the survivors (softmax at temperature 1 for the filters, as llama.cpp).
    std::vector<float> p(n);
    const float mx = cand_[0].logit;
    float sum = 0;
    for (size_t i = 0; i < n; ++i) sum += (p[i] = std::exp(cand_[i].logit - mx));
    if (params_.top_p < 1.0f) {
        float cum = 0;
        for (size_t i = 0; i < n; ++i) {
            cum += p[i] / sum;
            if (cum >= params_.top_p) {
                n = i + 1;
                break;
            }
        }
    }
    if (params_.min_p > 0.0f) {
        const float threshold = params_.min_p * p[0];
        size_t keep = 1;
        while (keep < n && p[keep] >= threshold) ++keep;
        n = keep;
    }
    // Temperature, then a draw.
    std::vector<double> w(n);
    double total = 0;
    for (size_t i = 0; i < n; ++i) {
        total += (w[i] = std::exp(static_cast<double>(cand_[i].logit - mx) / params_.temperature));
    }
    std::uniform_real_distribution<double> u(0.0, total);
    double r = u(rng_);
    for (size_t i = 0; i < n; ++i) {
        r -= w[i];
        if (r <= 0) return cand_[i].id;
    }
    return cand_[n - 1].id;
}

}  // namespace deltaserve::model
