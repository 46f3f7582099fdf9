// Token-eviction policies: which tokens of one (layer, KV head) a compressed cache keeps.
// The cache (EvictingSequenceCache) owns storage, budgets and bookkeeping; a policy only
// ranks. Methods and their sources: ../shared/methods/eviction-methods.md.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "deltaserve/common/status.h"

namespace deltaserve::kvstore {

// TRIM-KV's retention gates, one per layer: log beta = logsigmoid(W2 SiLU(W1 h + b1) + b2),
// one value per KV head, from the hidden state h entering the layer's attention (after its
// norm). Trained by `deltactl calibrate`, loaded by model/ (trimkv_profile.h).
struct RetentionGates {
    int32_t d_model = 0, hidden = 0, n_kv_heads = 0;
    struct Layer {
        std::vector<float> w1, b1;  // [hidden][d_model], [hidden]
        std::vector<float> w2, b2;  // [n_kv_heads][hidden], [n_kv_heads]
    };
    std::vector<Layer> layers;
};

// A context's KV policy and the settings the evicting ones share (DeltaKV's own are
// kvstore::DeltaKvOptions). Defaults: full KV, keep 1.
struct EvictionConfig {
    // A name from kv_policy.h's registry: full, deltakv, streaming, h2o, snapkv, keydiff,
    // kvcompress, d2o, trimkv.
    std::string policy = "full";
    // Target keep ratio: bytes held over the bytes of the same tokens in an fp16 full cache
    // (metadata counted), in (0, 1].
    float keep = 1.0f;
    int32_t sinks = 4;    // streaming: first tokens always kept
    int32_t window = 32;  // snapkv: observation window; h2o / streaming: at least this recent
    std::shared_ptr<const RetentionGates> gates;  // trimkv

    // kInvalidArgument for an unknown policy, a keep ratio outside (0, 1] or below 1 for a
    // policy that keeps every token, or bad sinks / window.
    Status validate() const;
};

// What a policy sees of one (layer, KV head) when it must shrink it: the entries in
// position order (the newest last), each with its position and the statistic the cache
// accumulated for it (attention mass for h2o, window attention for snapkv), and its key.
struct UnitView {
    int32_t n = 0;
    const int32_t* pos = nullptr;
    const float* stat = nullptr;
    int32_t head_dim = 0;
    // Where the unit sits among the layers the policy ranks: every layer, or a model's global
    // layers when the others attend a sliding window (EvictingSequenceCache).
    int32_t layer = 0, n_layers = 0;
    int32_t n_tokens = 0;    // tokens in the sequence
    float* state = nullptr;  // one float the policy may keep per unit (D2O's threshold)
    // Key of entry j (after RoPE) as floats into out[head_dim].
    virtual void key(int32_t j, float* out) const = 0;

  protected:
    ~UnitView() = default;
};

// Which attention statistic the cache gathers for a policy in SequenceCache::observe.
enum class AttentionStat {
    kNone,
    kAllQueries,  // attention of every new query, accumulated (h2o)
    kLastWindow,  // attention of the last `window` queries of a chunk, reset per chunk (snapkv)
    // Squared attention: of the last 8 queries of a chunk (reset per chunk), then added up
    // over decode steps (KV-Compress, continual mode).
    kSquaredWindowThenDecode,
    // Not attention: a value per token and KV head computed once, when the token is created,
    // from the hidden state entering attention (TRIM-KV's log retention).
    kTokenGate,
};

class EvictionPolicy {
  public:
    virtual ~EvictionPolicy() = default;
    virtual const char* name() const = 0;
    virtual AttentionStat stat() const { return AttentionStat::kNone; }
    // Whether the cache is shrunk after every forward call (decode steps included), or only
    // after a chunk of several tokens (a prompt), as SnapKV compresses prompts only.
    virtual bool continual() const { return true; }
    // Marks `budget` (< u.n) entries of u to keep in keep[0, u.n).
    virtual void select(const UnitView& u, int32_t budget, std::vector<uint8_t>& keep) const = 0;
    // Policies that spread one budget over all (layer, head) units (KV-Compress): given every
    // ranked unit and the total entries the sequence may keep in them, the entries each keeps.
    // Empty
    // (the default): every unit gets the same budget.
    virtual std::vector<int32_t> budgets(const std::vector<const UnitView*>& units,
                                         int64_t total) const {
        (void)units, (void)total;
        return {};
    }
    // An evicted entry folded into a kept one (D2O): the kept entry's K and V become
    // w_to * itself + sum of w_from * each entry merged into it.
    struct Merge {
        int32_t from = 0, to = 0;
        float w_from = 0.0f, w_to = 1.0f;
    };
    // kTokenGate policies: the value of each of n new tokens for every KV head
    // (out[i * n_kv_heads + g]), from their hidden states (ldh floats apart).
    virtual void token_gate(int32_t layer, const float* hidden, int64_t ldh, int32_t n,
                            float* out) const {
        (void)layer, (void)hidden, (void)ldh, (void)n, (void)out;
    }
    // After select(): which evicted entries to merge, and how. Default: none.
    virtual std::vector<Merge> merges(const UnitView& u, const std::vector<uint8_t>& keep) const {
        (void)u, (void)keep;
        return {};
    }
};

// The EvictionPolicy of an evicting policy (kv_policy.h: KvCacheKind::kEvicting). Errors:
// kInvalidArgument for another policy or bad numbers (EvictionConfig::validate).
Result<std::unique_ptr<EvictionPolicy>> make_eviction_policy(const EvictionConfig& config);

}  // namespace deltaserve::kvstore
