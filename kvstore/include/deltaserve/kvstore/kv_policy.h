// The KV cache policies, declared once: each one's name, which cache holds its KV, what that
// cache can do and what it needs. The model's context (which cache to make), the decode worker
// (ship, share, page), the KV stream (its codec), the CLI, the benchmarks and the cluster
// YAML ask here instead of testing names.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "deltaserve/common/status.h"
#include "deltaserve/kvstore/eviction_policy.h"

namespace deltaserve::kvstore {

enum class KvCacheKind : uint8_t {
    kFull,      // FullSequenceCache: every token, in blocks of the node's BlockPool
    kDeltaKv,   // DeltaKvSequenceCache (deltakv_cache.h)
    kEvicting,  // EvictingSequenceCache with the policy's EvictionPolicy (evicting_cache.h)
};

// How a cache's blocks travel (transport::KvCodec on the wire): a policy's shipments and,
// later, its stored blocks name it.
enum class KvCodecId : uint8_t {
    kNone,     // not shippable
    kRows,     // K and V rows at the cache's precision (fp16 or fp32)
    kDeltaKv,  // references, int4 latents and their reference ordinals
};

struct KvPolicyInfo {
    std::string_view name;
    std::string_view summary;  // one line, for help texts
    KvCacheKind kind = KvCacheKind::kFull;
    // Holds fewer bytes than full KV: takes a keep ratio below 1.
    bool compresses = false;
    // Its committed tokens ship between nodes in its own form (SequenceCache::export_state).
    bool shippable = false;
    // A prefix's state is that of the prefix computed alone, so blocks are shared across
    // prompts (automatic prefix caching). A compressing or evicting cache decides by what
    // came after.
    bool shareable = false;
    // Its blocks can leave decode memory and come back (the tiered store; issue 36).
    bool storable = false;
    // Held in blocks of the node's BlockPool (block_pool.h); the others keep pools of their
    // own, counted against the node's budget by their bytes.
    bool paged = false;
    // The calibrated profile it needs (deltactl calibrate), by its file name in
    // profiles/<model file>/; empty when none.
    std::string_view profile_file;
    KvCodecId codec = KvCodecId::kNone;
    // Whether llama.cpp-compatible attention (AttentionNumerics::kGgml) can run over it.
    bool ggml_attention = false;
    // Runs models with sliding-window layers (Gemma 3) past their window: a window layer
    // holds only its window (full: KvLayerGroups; the evicting ones: EvictingSequenceCache,
    // outside their budget; deltakv: exact, beside the global layers it compresses). A policy
    // without it would serve such a model up to its window only, where its window layers
    // equal global ones.
    bool windows = false;
};

// Every policy, full first.
std::span<const KvPolicyInfo> kv_policies();
// The policy called `name`; kInvalidArgument naming the known ones otherwise.
Result<const KvPolicyInfo*> find_kv_policy(std::string_view name);
// "full, deltakv, streaming, ..."
std::string kv_policy_names();

}  // namespace deltaserve::kvstore
