#include "deltaserve/kvstore/kv_policy.h"

#include <array>

namespace deltaserve::kvstore {

namespace {

constexpr KvPolicyInfo evicting(std::string_view name, std::string_view summary) {
    KvPolicyInfo p;
    p.name = name;
    p.summary = summary;
    p.kind = KvCacheKind::kEvicting;
    p.compresses = true;
    p.windows = true;  // a window layer keeps its window, outside the budget
    return p;
}

constexpr std::array<KvPolicyInfo, 9> kPolicies = [] {
    KvPolicyInfo full;
    full.name = "full";
    full.summary = "every token, exact (paged, prefixes shared across prompts)";
    full.kind = KvCacheKind::kFull;
    full.shippable = full.shareable = full.storable = full.paged = true;
    full.codec = KvCodecId::kRows;
    full.ggml_attention = true;
    full.windows = true;
    KvPolicyInfo deltakv;
    deltakv.name = "deltakv";
    deltakv.summary = "DeltaKV: references kept exact, the rest as small latent residuals";
    deltakv.kind = KvCacheKind::kDeltaKv;
    deltakv.compresses = deltakv.shippable = deltakv.storable = true;
    deltakv.profile_file = "deltakv.json";
    deltakv.codec = KvCodecId::kDeltaKv;
    deltakv.windows = true;  // a window layer keeps its window exact; global layers compress
    KvPolicyInfo trimkv = evicting("trimkv", "TRIM-KV: learned retention gates evict per head");
    trimkv.profile_file = "trimkv.json";
    return std::array<KvPolicyInfo, 9>{
        full,
        deltakv,
        evicting("streaming", "StreamingLLM: sinks and the most recent tokens"),
        evicting("h2o", "H2O: recent tokens and heavy hitters by attention"),
        evicting("snapkv", "SnapKV: what the prompt's last queries attend"),
        evicting("keydiff", "KeyDiff: keys least like the mean key"),
        evicting("kvcompress", "KV-Compress: one budget over every head and layer"),
        evicting("d2o", "D2O: layer budgets by attention variance, evicted keys merged"),
        trimkv,
    };
}();

}  // namespace

std::span<const KvPolicyInfo> kv_policies() { return kPolicies; }

std::string kv_policy_names() {
    std::string out;
    for (const KvPolicyInfo& p : kPolicies) {
        if (!out.empty()) out += ", ";
        out += p.name;
    }
    return out;
}

Result<const KvPolicyInfo*> find_kv_policy(std::string_view name) {
    for (const KvPolicyInfo& p : kPolicies) {
        if (p.name == name) return &p;
    }
    return invalid_argument("unknown KV policy '" + std::string(name.substr(0, 64)) +
                            "' (known: " + kv_policy_names() + ")");
}

Status EvictionConfig::validate() const {
    DS_ASSIGN_OR_RETURN(const KvPolicyInfo* p, find_kv_policy(policy));
    if (!(keep > 0.0f && keep <= 1.0f)) {
        return invalid_argument("keep ratio must be in (0, 1], not " + std::to_string(keep));
    }
    if (!p->compresses && keep < 1.0f) {
        return invalid_argument("a keep ratio below 1 needs a KV policy that compresses (" +
                                kv_policy_names() + ")");
    }
    if (sinks < 0 || window < 1) return invalid_argument("sinks must be >= 0 and window >= 1");
    return {};
}

}  // namespace deltaserve::kvstore
