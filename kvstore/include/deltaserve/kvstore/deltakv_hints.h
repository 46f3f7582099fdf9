// DeltaKV's hint providers: what a decode step attends besides its own pick
// (deltakv_cache.h, README "Pins" and "Following"). Pins: the pin_ratio share of the
// compressed region that a chunk's last queries attended most, each token scored by the best
// of its neighbours (pin_after before, pin_before after, 1% less per position), chosen at the
// chunk's commit and kept until the next chunk or a truncation. Following: the `follow`
// latent tokens a single-token call attended most (their largest attention weight's log),
// with the follow_ahead positions after each, for the next call. The cache computes the
// attention; this class keeps the scores and makes the choices. Not thread-safe.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "deltaserve/common/status.h"

namespace deltaserve::kvstore {

class DeltaKvHints {
  public:
    struct Options {
        float pin_ratio = 0.0f;
        int32_t pin_after = 12, pin_before = 2;
        int32_t follow = 0, follow_ahead = 0;
    };
    explicit DeltaKvHints(const Options& options) : o_(options) {}

    // A chunk's attention to the region's tokens at `pos`: mass[h * pos.size() + j] for
    // head h; each position keeps its largest. `end`: positions the sequence has now.
    void add_pin_mass(std::span<const int32_t> pos, const float* mass, int n_heads, size_t end);
    // At a chunk's commit: the pins of the region [r0, r1) (scored tokens only), replacing
    // the last chunk's.
    void choose_pins(int32_t r0, int32_t r1);
    // A single-token call's attention to latent tokens at `pos`: the log of the largest
    // weight each took in one layer (log_weight[j]); each position keeps its largest.
    void add_follow(std::span<const int32_t> pos, const float* log_weight, size_t end);
    // At a single-token call's commit: what the next one follows.
    void choose_follow();
    // A truncation: nothing is pinned, followed or scored.
    void clear();

    // Sorted positions.
    const std::vector<int32_t>& pins() const { return pins_; }
    const std::vector<int32_t>& follow() const { return follow_; }

    // The pins as a session's KV carries them (SequenceCodec::export_hints); import checks
    // that each is a token of the region [r0, r1), in increasing order (kDataLoss otherwise).
    std::vector<uint8_t> export_pins() const;
    Status import_pins(std::span<const uint8_t> hints, int32_t r0, int32_t r1);

  private:
    static constexpr float kNotFollowed = -std::numeric_limits<float>::infinity();

    Options o_;
    std::vector<float> pin_score_;  // per position, the chunk's largest mass
    std::vector<int32_t> pins_;
    std::vector<float> follow_score_;      // per position, kNotFollowed where not touched
    std::vector<int32_t> follow_touched_;  // where follow_score_ is set
    std::vector<int32_t> follow_;
};

}  // namespace deltaserve::kvstore
