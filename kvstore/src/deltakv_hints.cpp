#include "deltaserve/kvstore/deltakv_hints.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "byte_io.h"

namespace deltaserve::kvstore {

void DeltaKvHints::add_pin_mass(std::span<const int32_t> pos, const float* mass, int n_heads,
                                size_t end) {
    if (pin_score_.size() < end) pin_score_.resize(end, 0.0f);
    const size_t nb = pos.size();
    for (int h = 0; h < n_heads; ++h) {
        const float* mh = mass + static_cast<size_t>(h) * nb;
        for (size_t j = 0; j < nb; ++j) pin_score_[pos[j]] = std::max(pin_score_[pos[j]], mh[j]);
    }
}

void DeltaKvHints::choose_pins(int32_t r0, int32_t comp_end) {
    pins_.clear();
    const int32_t r1 = std::min<int32_t>(comp_end, static_cast<int32_t>(pin_score_.size()));
    // A token's score is the best of the tokens up to pin_after before it and pin_before
    // after it (SnapKV pools its scores, symmetrically), 1% less per position between them:
    // generation reads on from where the prompt pointed, as a head that matched token j at
    // one step reads j + 1 at the next; nearer tokens first.
    std::vector<float> pooled(static_cast<size_t>(std::max(0, r1 - r0)), 0.0f);
    std::vector<int32_t> cand;
    for (int32_t p = r0; p < r1; ++p) {
        float best = 0.0f;
        for (int32_t d = std::max(r0, p - o_.pin_after); d <= std::min(r1 - 1, p + o_.pin_before);
             ++d)
            best = std::max(best,
                            pin_score_[d] * (1.0f - 0.01f * static_cast<float>(std::abs(p - d))));
        pooled[p - r0] = best;
        if (best > 0.0f) cand.push_back(p);
    }
    const size_t want = std::min(
        cand.size(), static_cast<size_t>(std::ceil(o_.pin_ratio * std::max(0, comp_end - r0))));
    std::nth_element(cand.begin(), cand.begin() + want, cand.end(), [&](int32_t a, int32_t b) {
        const float sa = pooled[a - r0], sb = pooled[b - r0];
        return sa != sb ? sa > sb : a > b;
    });
    cand.resize(want);
    std::sort(cand.begin(), cand.end());
    pins_ = std::move(cand);
    pin_score_.clear();
}

void DeltaKvHints::add_follow(std::span<const int32_t> pos, const float* log_weight, size_t end) {
    if (follow_score_.size() < end) follow_score_.resize(end, kNotFollowed);
    for (size_t j = 0; j < pos.size(); ++j) {
        float& best = follow_score_[pos[j]];
        if (log_weight[j] <= best) continue;
        if (best == kNotFollowed) follow_touched_.push_back(pos[j]);
        best = log_weight[j];
    }
}

void DeltaKvHints::choose_follow() {
    follow_.clear();
    auto& c = follow_touched_;
    const size_t want = std::min(c.size(), static_cast<size_t>(std::max(0, o_.follow)));
    std::nth_element(c.begin(), c.begin() + want, c.end(), [&](int32_t a, int32_t b) {
        return follow_score_[a] != follow_score_[b] ? follow_score_[a] > follow_score_[b] : a > b;
    });
    for (size_t i = 0; i < want; ++i) {
        for (int32_t d = 0; d <= o_.follow_ahead; ++d) follow_.push_back(c[i] + d);
    }
    std::sort(follow_.begin(), follow_.end());
    follow_.erase(std::unique(follow_.begin(), follow_.end()), follow_.end());
    for (int32_t p : c) follow_score_[p] = kNotFollowed;
    c.clear();
}

void DeltaKvHints::clear() {
    pins_.clear();
    pin_score_.clear();
    follow_.clear();
    for (int32_t p : follow_touched_) follow_score_[p] = kNotFollowed;
    follow_touched_.clear();
}

std::vector<uint8_t> DeltaKvHints::export_pins() const {
    std::vector<uint8_t> out;
    if (pins_.empty()) return out;
    ByteWriter w(out);
    w.i32(static_cast<int32_t>(pins_.size()));
    for (int32_t p : pins_) w.i32(p);
    return out;
}

Status DeltaKvHints::import_pins(std::span<const uint8_t> hints, int32_t r0, int32_t r1) {
    if (hints.empty()) {
        pins_.clear();
        return {};
    }
    ByteReader r(hints);
    int32_t n = 0;
    if (!r.i32(n) || n < 0 || static_cast<size_t>(n) * 4 != r.remaining()) {
        return data_loss("DeltaKV hints: malformed pin list");
    }
    std::vector<int32_t> pins(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) {
        r.i32(pins[i]);
        const int32_t p = pins[i];
        // Tokens of the compressed region (latents and references), in increasing order.
        if (p < r0 || p >= r1 || (i > 0 && p <= pins[i - 1])) {
            return data_loss("DeltaKV hints: pin " + std::to_string(p) +
                             " is not a token of the compressed region in order");
        }
    }
    pins_ = std::move(pins);
    return {};
}

}  // namespace deltaserve::kvstore
