// A sequence cache that keeps a budget of tokens per (layer, KV head), chosen by an
// EvictionPolicy, in a HeadSlotPool: what it evicts is freed at once.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "deltaserve/common/thread_pool.h"
#include "deltaserve/kvstore/eviction_policy.h"
#include "deltaserve/kvstore/head_slot_pool.h"
#include "deltaserve/kvstore/kv_cache.h"
#include "deltaserve/kvstore/kv_layer_groups.h"

namespace deltaserve::kvstore {

// Budget: after a commit (every commit for continual policies, prompts of 2+ tokens for the
// others), each (layer, head) of a global layer keeps at most keep * n_tokens * (fp16 K+V
// bytes of a token's head) / (bytes held per kept entry) entries, so that its bytes over
// full_fp16_bytes() of the global layers meet the keep ratio with the slot ids, positions and
// statistics counted.
//
// Sliding-window layers (Gemma 3's local layers; window_layer[l] and `window`): whatever the
// policy, such a layer keeps, after each commit, the positions the next query's window
// reaches and kWindowSlack before them (so a turn may rewind that far), every one of them;
// the policy neither ranks them nor counts them in its budget (a policy that spreads one
// budget over every unit spreads it over the global layers'). Their view sets
// KvView::window, so each query of a chunk sees its own window. A truncate to a position
// whose window they no longer hold keeps nothing (kept_by_truncate).
class EvictingSequenceCache final : public SequenceCache {
  public:
    static constexpr int32_t kWindowSlack = kvstore::kWindowSlack;
    // window_layer: per model layer, whether it attends a window of `window` tokens (empty,
    // or window 0: none).
    EvictingSequenceCache(HeadSlotPool& pool, std::unique_ptr<EvictionPolicy> policy,
                          const EvictionConfig& config, std::vector<bool> window_layer = {},
                          int32_t window = 0);
    ~EvictingSequenceCache() override;
    EvictingSequenceCache(const EvictingSequenceCache&) = delete;
    EvictingSequenceCache& operator=(const EvictingSequenceCache&) = delete;

    int32_t n_tokens() const override { return n_tokens_; }
    Status reserve(int32_t n_new) override;
    Status store(int32_t layer, int32_t first, int32_t n, const float* k, const float* v,
                 int64_t ld) override;
    kernels::KvView view(int32_t layer, int32_t n_visible_new) const override;
    Status observe(int32_t layer, const kernels::AttentionShape& shape, const float* q, int64_t ldq,
                   const float* hidden, int64_t ldh, int32_t n, ThreadPool& pool) override;
    Status commit(int32_t n) override;
    void truncate(int32_t n_keep) override;
    int32_t kept_by_truncate(int32_t n_keep) const override;
    // Every entry held (K, V, slot id, position, statistic; reserved ones too) and each
    // unit's policy state, window layers' included.
    size_t bytes() const override;
    size_t bytes_bound(int32_t n_tokens) const override;

    // Positions kept in a (layer, KV head), oldest first (committed ones).
    std::span<const int32_t> positions(int32_t layer, int32_t head) const;
    // Entries a global layer's (layer, head) may keep with n_tokens tokens in the sequence.
    int32_t budget(int32_t n_tokens) const;
    bool is_window_layer(int32_t layer) const { return window_ > 0 && window_layer_[layer]; }

  private:
    struct Unit {
        std::vector<int32_t> slot, pos;  // kept entries in position order, then reserved ones
        std::vector<float> stat;         // the policy's attention statistic, per entry
        float state = 0.0f;              // the policy's own (UnitView::state)
    };
    void apply_merges(int32_t unit, const std::vector<EvictionPolicy::Merge>& merges);
    // Removes the entries j of a unit for which dropped(j), freeing their slots.
    template <class Drop>
    void drop(int32_t unit, Drop&& dropped);
    int32_t committed(const Unit& u) const {
        return static_cast<int32_t>(u.slot.size()) - n_reserved_;
    }
    size_t entry_bytes() const;
    void shrink();
    // Window layers: drops the entries no query from position `from` on reaches, less the slack.
    void drop_before_window(int32_t from);
    // Entries a window layer's unit holds at most after a commit.
    int32_t window_entries(int32_t n_tokens) const;

    HeadSlotPool& pool_;
    std::unique_ptr<EvictionPolicy> policy_;
    EvictionConfig config_;
    std::vector<bool> window_layer_;  // per layer (every layer, false without windows)
    int32_t window_ = 0;
    std::vector<int32_t> ranked_;  // the units of global layers, which the policy ranks
    int32_t window_first_ = 0;     // window layers: the first position they hold
    std::vector<Unit> units_;
    int32_t n_tokens_ = 0;
    int32_t n_reserved_ = 0;
    mutable std::vector<const int32_t*> lists_;  // view(): per-head slot lists and counts
    mutable std::vector<int32_t> counts_;
};

}  // namespace deltaserve::kvstore
