// The eviction baselines and KeyDiff (../shared/methods/eviction-methods.md):
//   streaming  StreamingLLM: attention sinks and the most recent tokens;
//   h2o        H2O: the most recent half of the budget, the rest the heavy hitters by
//              attention accumulated over every query so far;
//   snapkv     SnapKV: after a prompt, the observation window (its last tokens) and the
//              earlier tokens the window attends to most (scores average-pooled, kernel 5);
//   keydiff    KeyDiff: the keys least similar to the mean normalised key (no attention);
//   kvcompress KV-Compress: per-head variable budgets from one budget for the whole sequence;
//              metric = squared attention of the last 8 prompt queries (then of every decode
//              step), max-pooled over 7; the cheapest blocks of 16 go first across all heads
//              and layers; the last 32 tokens are protected (fewer when the budget is tighter).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "deltaserve/kvstore/eviction_policy.h"

namespace deltaserve::kvstore {

namespace {

// Marks the `count` best of entries [begin, end) by score (ties go to the newer entry).
void keep_best(const std::vector<float>& score, int32_t begin, int32_t end, int32_t count,
               std::vector<uint8_t>& keep) {
    count = std::clamp(count, 0, end - begin);
    std::vector<int32_t> idx(static_cast<size_t>(end - begin));
    std::iota(idx.begin(), idx.end(), begin);
    std::nth_element(idx.begin(), idx.begin() + count, idx.end(), [&](int32_t a, int32_t b) {
        return score[a] != score[b] ? score[a] > score[b] : a > b;
    });
    for (int32_t i = 0; i < count; ++i) keep[idx[i]] = 1;
}

class Streaming final : public EvictionPolicy {
public:
    explicit Streaming(int32_t sinks) : sinks_(sinks) {}
    const char* name() const override { return "streaming"; }
    void select(const UnitView& u, int32_t budget, std::vector<uint8_t>& keep) const override {
        const int32_t sinks = std::min(sinks_, budget);
        for (int32_t j = 0; j < sinks; ++j) keep[j] = 1;
        for (int32_t j = u.n - (budget - sinks); j < u.n; ++j) keep[j] = 1;
    }

private:
    int32_t sinks_;
};

class H2O final : public EvictionPolicy {
public:
    const char* name() const override { return "h2o"; }
    AttentionStat stat() const override { return AttentionStat::kAllQueries; }
    void select(const UnitView& u, int32_t budget, std::vector<uint8_t>& keep) const override {
        const int32_t recent = std::max(1, budget / 2);
        for (int32_t j = u.n - recent; j < u.n; ++j) keep[j] = 1;
        std::vector<float> score(u.stat, u.stat + u.n);
        keep_best(score, 0, u.n - recent, budget - recent, keep);
    }
};

class SnapKV final : public EvictionPolicy {
public:
    explicit SnapKV(int32_t window) : window_(window) {}
    const char* name() const override { return "snapkv"; }
    AttentionStat stat() const override { return AttentionStat::kLastWindow; }
    bool continual() const override { return false; }
    void select(const UnitView& u, int32_t budget, std::vector<uint8_t>& keep) const override {
        const int32_t w = std::min({window_, budget, u.n});
        for (int32_t j = u.n - w; j < u.n; ++j) keep[j] = 1;
        const int32_t prefix = u.n - w;
        constexpr int kPool = 5;  // avg_pool1d(kernel 5, padding 2): zeros past the ends count
        std::vector<float> pooled(static_cast<size_t>(prefix));
        for (int32_t j = 0; j < prefix; ++j) {
            float sum = 0;
            for (int32_t t = std::max(0, j - kPool / 2); t <= std::min(prefix - 1, j + kPool / 2); ++t) sum += u.stat[t];
            pooled[j] = sum / kPool;
        }
        keep_best(pooled, 0, prefix, budget - w, keep);
    }

private:
    int32_t window_;
};

class KeyDiff final : public EvictionPolicy {
public:
    const char* name() const override { return "keydiff"; }
    void select(const UnitView& u, int32_t budget, std::vector<uint8_t>& keep) const override {
        const int d = u.head_dim;
        std::vector<float> keys(static_cast<size_t>(u.n) * d), anchor(d, 0.0f);
        for (int32_t j = 0; j < u.n; ++j) {
            float* k = keys.data() + static_cast<size_t>(j) * d;
            u.key(j, k);
            double norm = 0;
            for (int i = 0; i < d; ++i) norm += double(k[i]) * k[i];
            const float inv = norm > 0 ? static_cast<float>(1.0 / std::sqrt(norm)) : 0.0f;
            for (int i = 0; i < d; ++i) anchor[i] += (k[i] *= inv);
        }
        double anorm = 0;
        for (float a : anchor) anorm += double(a) * a;
        const float ainv = anorm > 0 ? static_cast<float>(1.0 / std::sqrt(anorm)) : 0.0f;
        std::vector<float> score(static_cast<size_t>(u.n));
        for (int32_t j = 0; j < u.n; ++j) {
            const float* k = keys.data() + static_cast<size_t>(j) * d;
            float c = 0;
            for (int i = 0; i < d; ++i) c += k[i] * anchor[i];
            score[j] = -c * ainv;  // -cos(k_j, anchor)
        }
        keep_best(score, 0, u.n, budget, keep);
    }
};

class KVCompress final : public EvictionPolicy {
public:
    static constexpr int32_t kProtected = 32, kBlock = 16, kPool = 7;
    const char* name() const override { return "kvcompress"; }
    AttentionStat stat() const override { return AttentionStat::kSquaredWindowThenDecode; }

    // Metric per entry: the statistic max-pooled over kPool neighbours.
    static std::vector<float> metric(const UnitView& u) {
        std::vector<float> m(static_cast<size_t>(u.n));
        for (int32_t j = 0; j < u.n; ++j) {
            float best = 0.0f;
            for (int32_t t = std::max(0, j - kPool / 2); t <= std::min(u.n - 1, j + kPool / 2); ++t) {
                best = std::max(best, u.stat[t]);
            }
            m[j] = best;
        }
        return m;
    }

    std::vector<int32_t> budgets(const std::vector<const UnitView*>& units, int64_t total) const override {
        // Blocks of kBlock entries per unit, in metric order; a block costs its largest metric.
        struct Block {
            float cost;
            int32_t unit, size;
        };
        std::vector<Block> blocks;
        std::vector<int32_t> keep(units.size());
        int64_t kept = 0;
        // Protection never takes more than an even share of the budget.
        const int64_t share = units.empty() ? 0 : total / static_cast<int64_t>(units.size());
        const int32_t protect = static_cast<int32_t>(std::min<int64_t>(kProtected, share));
        for (size_t i = 0; i < units.size(); ++i) {
            const UnitView& u = *units[i];
            const int32_t prot = std::min(protect, u.n);
            std::vector<float> m = metric(u);
            m.resize(static_cast<size_t>(u.n - prot));  // protected entries are the newest
            std::sort(m.begin(), m.end(), std::greater<>());
            for (size_t b = 0; b < m.size(); b += kBlock) {
                blocks.push_back({m[b], static_cast<int32_t>(i), static_cast<int32_t>(std::min<size_t>(kBlock, m.size() - b))});
            }
            keep[i] = u.n;
            kept += u.n;
        }
        // Evict the cheapest blocks until the total fits; within a unit the cheapest blocks
        // are its last ones in metric order, which select() then drops.
        std::sort(blocks.begin(), blocks.end(), [](const Block& a, const Block& b) { return a.cost < b.cost; });
        for (const Block& b : blocks) {
            if (kept <= total) break;
            keep[b.unit] -= b.size;
            kept -= b.size;
        }
        return keep;
    }

    void select(const UnitView& u, int32_t budget, std::vector<uint8_t>& keep) const override {
        const int32_t prot = std::min({kProtected, u.n, budget});
        for (int32_t j = u.n - prot; j < u.n; ++j) keep[j] = 1;
        keep_best(metric(u), 0, u.n - prot, budget - prot, keep);
    }
};

}  // namespace

const char* eviction_policy_names() { return "full, deltakv, streaming, h2o, snapkv, keydiff, kvcompress"; }

Result<std::unique_ptr<EvictionPolicy>> make_eviction_policy(const EvictionConfig& c) {
    if (!(c.keep > 0.0f && c.keep <= 1.0f)) {
        return invalid_argument("keep ratio must be in (0, 1], not " + std::to_string(c.keep));
    }
    if (c.sinks < 0 || c.window < 1) return invalid_argument("sinks must be >= 0 and window >= 1");
    if (c.policy == "streaming") return std::unique_ptr<EvictionPolicy>(new Streaming(c.sinks));
    if (c.policy == "h2o") return std::unique_ptr<EvictionPolicy>(new H2O());
    if (c.policy == "snapkv") return std::unique_ptr<EvictionPolicy>(new SnapKV(c.window));
    if (c.policy == "keydiff") return std::unique_ptr<EvictionPolicy>(new KeyDiff());
    if (c.policy == "kvcompress") return std::unique_ptr<EvictionPolicy>(new KVCompress());
    return invalid_argument("unknown KV policy '" + c.policy + "' (known: " + eviction_policy_names() + ")");
}

}  // namespace deltaserve::kvstore
