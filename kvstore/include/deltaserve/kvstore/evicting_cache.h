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

namespace deltaserve::kvstore {

// Budget: after a commit (every commit for continual policies, prompts of 2+ tokens for the
// others), each (layer, head) keeps at most keep * n_tokens * (fp16 K+V bytes of a token's
// head) / (bytes held per kept entry) entries, so that bytes() / full_fp16_bytes() meets the
// keep ratio with the slot ids, positions and statistics counted.
class EvictingSequenceCache final : public SequenceCache {
  public:
    EvictingSequenceCache(HeadSlotPool& pool, std::unique_ptr<EvictionPolicy> policy,
                          const EvictionConfig& config);
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
    size_t bytes() const override;
    size_t bytes_bound(int32_t n_tokens) const override;

    // Positions kept in a (layer, KV head), oldest first (committed ones).
    std::span<const int32_t> positions(int32_t layer, int32_t head) const;
    // Entries a (layer, head) may keep with n_tokens tokens in the sequence.
    int32_t budget(int32_t n_tokens) const;

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

    HeadSlotPool& pool_;
    std::unique_ptr<EvictionPolicy> policy_;
    EvictionConfig config_;
    std::vector<Unit> units_;
    int32_t n_tokens_ = 0;
    int32_t n_reserved_ = 0;
    mutable std::vector<const int32_t*> lists_;  // view(): per-head slot lists and counts
    mutable std::vector<int32_t> counts_;
};

}  // namespace deltaserve::kvstore
