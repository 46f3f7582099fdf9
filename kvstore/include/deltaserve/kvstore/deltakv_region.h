// The layout of a DeltaKV session's compressed region (methods/deltakv.md): positions
// [sinks, end) are references, kept exact (every stride-th token, and those a compression
// keeps exact), or latent tokens, which every sparse layer holds as a packed latent and the
// ordinals of its k nearest references. An ordinal counts the sinks (0..sinks-1), then the
// references after them in position order, so a token finds its references without a lookup
// and adding a reference renumbers those after it. The cache's pools hold the rows; this holds
// which position is which and the latents. Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace deltaserve::kvstore {

struct DeltaKvRegion {
    static constexpr uint16_t kNoRef = 0xffff;  // an ordinal naming no reference

    DeltaKvRegion(int32_t sinks, int32_t stride, int32_t n_sparse_layers)
        : sinks(sinks),
          stride(stride),
          end(sinks),
          latents(n_sparse_layers),
          refs(n_sparse_layers),
          errors(n_sparse_layers) {}

    bool is_ref(int32_t pos) const { return pos < sinks || ref_flag[pos] != 0; }
    // The position an ordinal names, -1 for kNoRef.
    int32_t ref_position(uint16_t ordinal) const {
        return ordinal == kNoRef ? -1 : ordinal < sinks ? ordinal : ref_list[ordinal - sinks];
    }
    // References in [sinks, end).
    int32_t n_refs() const;
    // Latent tokens in the region.
    int32_t n_latents() const { return end - sinks - n_refs(); }
    // Marks which tokens of [c0, c1) are references: every stride-th after the sinks.
    void choose_refs(int32_t c0, int32_t c1);
    // ref_list again from ref_flag, after the flags changed.
    void sync_ref_list();
    // A new position past the last (full precision, no kind yet).
    void add_position() {
        latent_of.push_back(-1);
        ref_flag.push_back(0);
    }
    // Keeps the first n positions and their latents (latent_bytes each per sparse layer);
    // the region ends at n at most.
    void truncate(int32_t n, size_t latent_bytes, int32_t k);

    const int32_t sinks, stride;
    int32_t end;                     // the region is [sinks, end)
    std::vector<int32_t> latent_of;  // position -> latent index, -1 if full precision
    std::vector<uint8_t> ref_flag;   // position -> a reference (set when its block is compressed)
    // The references of the region and of a compression plan after the sinks, in position
    // order: a reference's ordinal is its index here plus the sinks.
    std::vector<int32_t> ref_list;
    std::vector<std::vector<uint8_t>> latents;  // per sparse layer: packed latents in order
    std::vector<std::vector<uint16_t>> refs;    // per sparse layer: k ordinals per latent
    // Per sparse layer, per latent: its reconstruction error when it was compressed
    // (deltakv_error_code).
    std::vector<std::vector<uint8_t>> errors;
};

// A latent's reconstruction error in one byte: its relative squared error e = |x^ - x|^2 /
// |x|^2 over the layer's K and V rows, logarithmic in steps of 2^(1/8) (about 4.4% of the
// RMS error) from 2^-23 to 2^8.75; 0 is "not measured".
uint8_t deltakv_error_code(double relative_squared_error);
// The relative squared error a code stands for; NaN for 0.
double deltakv_error_of_code(uint8_t code);

// What the commit of a forward call compresses (DeltaKvSequenceCache::plan_compression):
// the region's end after it, each block's end, the blocks' tokens that become latents (in
// order), and per sparse layer whether its latents were made (at its observe, or at commit),
// which wait here until the commit moves them into the region.
struct DeltaKvPlan {
    explicit DeltaKvPlan(int32_t n_sparse_layers)
        : done(n_sparse_layers, 0),
          latents(n_sparse_layers),
          refs(n_sparse_layers),
          err(n_sparse_layers),
          errors(n_sparse_layers) {}

    // A new plan for a session of n_total tokens whose region ends at region_end.
    void start(int32_t n_total, int32_t region_end);
    // Whether the first `judges` sparse layers compressed the plan.
    bool decided(int32_t judges) const;
    // How many of n latent tokens a share keeps exact, with what earlier plans left over.
    size_t exact_count(size_t n, float share) const;

    bool active = false;
    int32_t n_total = 0, end = 0;
    std::vector<int32_t> blocks, tokens;
    std::vector<uint8_t> done;
    std::vector<std::vector<uint8_t>> latents;
    std::vector<std::vector<uint16_t>> refs;
    // Per sparse layer: the K and V squared reconstruction errors of each plan token, for the
    // tokens kept exact (DeltaKvOptions::exact_share).
    std::vector<std::vector<float>> err;
    // Per sparse layer: each latent's error code, as DeltaKvRegion::errors.
    std::vector<std::vector<uint8_t>> errors;
    // The fraction of a token the exact share left over from earlier plans (carry_before:
    // before this plan, for a plan that is dropped).
    double exact_carry = 0.0, carry_before = 0.0;
};

}  // namespace deltaserve::kvstore
