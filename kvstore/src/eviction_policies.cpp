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
//              and layers; the last 32 tokens are protected (fewer when the budget is tighter);
//   d2o        D2O: layer budgets from how spread each layer's attention is (low variance of
//              the accumulated attention = more cache; layers 0, 1 and the last kept whole
//              when affordable), then per head 4 sinks, a recent window and heavy hitters
//              (1:1), and each evicted token merged into its most similar kept key when the
//              similarity clears an EMA threshold (beta 0.7);
//   trimkv     TRIM-KV: each token's learned retention beta (a gate on its hidden state,
//              evaluated once when it is created); a token i scores (t - i) log beta_i at
//              time t, and each head keeps its best. No sinks or windows: the gates learn them.
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
            for (int32_t t = std::max(0, j - kPool / 2); t <= std::min(prefix - 1, j + kPool / 2);
                 ++t)
                sum += u.stat[t];
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
            for (int32_t t = std::max(0, j - kPool / 2); t <= std::min(u.n - 1, j + kPool / 2);
                 ++t) {
                best = std::max(best, u.stat[t]);
            }
            m[j] = best;
        }
        return m;
    }

    std::vector<int32_t> budgets(const std::vector<const UnitView*>& units,
                                 int64_t total) const override {
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
                blocks.push_back({m[b], static_cast<int32_t>(i),
                                  static_cast<int32_t>(std::min<size_t>(kBlock, m.size() - b))});
            }
            keep[i] = u.n;
            kept += u.n;
        }
        // Evict the cheapest blocks until the total fits; within a unit the cheapest blocks
        // are its last ones in metric order, which select() then drops.
        std::sort(blocks.begin(), blocks.end(),
                  [](const Block& a, const Block& b) { return a.cost < b.cost; });
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

class D2O final : public EvictionPolicy {
  public:
    static constexpr int32_t kSinks = 4;
    static constexpr float kBeta = 0.7f;
    const char* name() const override { return "d2o"; }
    AttentionStat stat() const override { return AttentionStat::kAllQueries; }

    std::vector<int32_t> budgets(const std::vector<const UnitView*>& units,
                                 int64_t total) const override {
        if (units.empty()) return {};
        const int32_t n_layers = units[0]->n_layers;
        const size_t heads = units.size() / static_cast<size_t>(n_layers);
        // Variance of each unit's accumulated attention, min-max normalised over all units,
        // averaged per layer.
        std::vector<double> var(units.size(), 0.0);
        for (size_t i = 0; i < units.size(); ++i) {
            const UnitView& u = *units[i];
            double mean = 0, sq = 0;
            for (int32_t j = 0; j < u.n; ++j) mean += u.stat[j];
            mean /= std::max(1, u.n);
            for (int32_t j = 0; j < u.n; ++j) sq += (u.stat[j] - mean) * (u.stat[j] - mean);
            var[i] = sq / std::max(1, u.n);
        }
        const auto [lo, hi] = std::minmax_element(var.begin(), var.end());
        const double span = *hi - *lo > 0 ? *hi - *lo : 1.0;
        std::vector<double> v(static_cast<size_t>(n_layers), 0.0);
        for (size_t i = 0; i < units.size(); ++i)
            v[i / heads] += (var[i] - *lo) / span / static_cast<double>(heads);
        std::vector<int32_t> keep(units.size());
        const int32_t n = units[0]->n_tokens;
        auto whole = [&](int32_t l) { return l == 0 || l == 1 || l == n_layers - 1; };
        // Layers 0, 1 and the last stay whole when the budget leaves the others 1% each.
        const int64_t floor_each = std::max<int64_t>(1, n / 100) * static_cast<int64_t>(heads);
        const bool protect = n_layers > 3 && total >= 3 * static_cast<int64_t>(heads) * n +
                                                          (n_layers - 3) * floor_each;
        const int64_t rest = protect ? total - 3 * static_cast<int64_t>(heads) * n : total;
        // Softmax(-v) weights over the compressed layers, water-filled into [1% of n, n].
        std::vector<double> w(static_cast<size_t>(n_layers), 0.0);
        double wsum = 0;
        for (int32_t l = 0; l < n_layers; ++l) {
            if (protect && whole(l)) continue;
            wsum += (w[l] = std::exp(-v[l]));
        }
        auto per_layer = [&](double c, int32_t l) {
            return std::clamp(c * w[l] / wsum, std::max(1.0, 0.01 * n), static_cast<double>(n));
        };
        double lo_c = 0, hi_c = static_cast<double>(rest) * 2 + 1;
        for (int it = 0; it < 60; ++it) {
            const double c = (lo_c + hi_c) / 2;
            double sum = 0;
            for (int32_t l = 0; l < n_layers; ++l) {
                if (!(protect && whole(l))) sum += per_layer(c, l) * static_cast<double>(heads);
            }
            (sum > static_cast<double>(rest) ? hi_c : lo_c) = c;
        }
        for (size_t i = 0; i < units.size(); ++i) {
            const int32_t l = static_cast<int32_t>(i / heads);
            keep[i] =
                protect && whole(l) ? n : static_cast<int32_t>(std::floor(per_layer(lo_c, l)));
        }
        return keep;
    }

    void select(const UnitView& u, int32_t budget, std::vector<uint8_t>& keep) const override {
        const int32_t sinks = std::min(kSinks, budget);
        for (int32_t j = 0; j < sinks; ++j) keep[j] = 1;
        const int32_t recent = (budget - sinks) / 2;
        for (int32_t j = u.n - recent; j < u.n; ++j) keep[j] = 1;
        std::vector<float> score(u.stat, u.stat + u.n);
        keep_best(score, sinks, u.n - recent, budget - sinks - recent, keep);
    }

    std::vector<Merge> merges(const UnitView& u, const std::vector<uint8_t>& keep) const override {
        const int d = u.head_dim;
        std::vector<int32_t> kept, evicted;
        for (int32_t j = 0; j < u.n; ++j) (keep[j] ? kept : evicted).push_back(j);
        if (kept.empty() || evicted.empty()) return {};
        auto unit_key = [&](int32_t j, float* out) {
            u.key(j, out);
            double nrm = 0;
            for (int i = 0; i < d; ++i) nrm += double(out[i]) * out[i];
            const float inv = nrm > 0 ? static_cast<float>(1.0 / std::sqrt(nrm)) : 0.0f;
            for (int i = 0; i < d; ++i) out[i] *= inv;
        };
        std::vector<float> kk(kept.size() * d), e(d);
        for (size_t c = 0; c < kept.size(); ++c) unit_key(kept[c], kk.data() + c * d);
        std::vector<std::pair<int32_t, float>> best(evicted.size());  // (kept index, cosine)
        double mean_best = 0;
        for (size_t i = 0; i < evicted.size(); ++i) {
            unit_key(evicted[i], e.data());
            best[i] = {0, -2.0f};
            for (size_t c = 0; c < kept.size(); ++c) {
                float s = 0;
                for (int t = 0; t < d; ++t) s += e[t] * kk[c * d + t];
                if (s > best[i].second) best[i] = {static_cast<int32_t>(c), s};
            }
            mean_best += best[i].second / static_cast<double>(evicted.size());
        }
        // EMA threshold over eviction rounds (the first round starts it at its own mean).
        float& tau = *u.state;
        tau = tau == 0.0f ? static_cast<float>(mean_best)
                          : kBeta * static_cast<float>(mean_best) + (1 - kBeta) * tau;
        // w_e = exp(u_e) / (sum exp(u) + e), w_c = e / (sum exp(u) + e), per target.
        std::vector<double> denom(kept.size(), std::exp(1.0));
        for (size_t i = 0; i < evicted.size(); ++i) {
            if (best[i].second >= tau) denom[best[i].first] += std::exp(best[i].second);
        }
        std::vector<Merge> out;
        for (size_t i = 0; i < evicted.size(); ++i) {
            if (best[i].second < tau) continue;
            const int32_t c = best[i].first;
            out.push_back({evicted[i], kept[c],
                           static_cast<float>(std::exp(best[i].second) / denom[c]),
                           static_cast<float>(std::exp(1.0) / denom[c])});
        }
        return out;
    }
};

class TrimKV final : public EvictionPolicy {
  public:
    explicit TrimKV(std::shared_ptr<const RetentionGates> gates) : gates_(std::move(gates)) {}
    const char* name() const override { return "trimkv"; }
    AttentionStat stat() const override { return AttentionStat::kTokenGate; }

    void token_gate(int32_t layer, const float* hidden, int64_t ldh, int32_t n,
                    float* out) const override {
        const RetentionGates& g = *gates_;
        const RetentionGates::Layer& w = g.layers[layer];
        std::vector<float> u(static_cast<size_t>(g.hidden));
        for (int32_t i = 0; i < n; ++i) {
            const float* h = hidden + i * ldh;
            for (int32_t j = 0; j < g.hidden; ++j) {
                const float* row = w.w1.data() + static_cast<size_t>(j) * g.d_model;
                float a = w.b1[j];
                for (int32_t t = 0; t < g.d_model; ++t) a += row[t] * h[t];
                u[j] = a / (1.0f + std::exp(-a));
            }
            for (int32_t head = 0; head < g.n_kv_heads; ++head) {
                const float* row = w.w2.data() + static_cast<size_t>(head) * g.hidden;
                float z = w.b2[head];
                for (int32_t j = 0; j < g.hidden; ++j) z += row[j] * u[j];
                // log sigmoid(z), stable for either sign
                out[static_cast<size_t>(i) * g.n_kv_heads + head] =
                    z >= 0 ? -std::log1p(std::exp(-z)) : z - std::log1p(std::exp(z));
            }
        }
    }

    void select(const UnitView& u, int32_t budget, std::vector<uint8_t>& keep) const override {
        std::vector<float> score(static_cast<size_t>(u.n));
        for (int32_t j = 0; j < u.n; ++j)
            score[j] = static_cast<float>(u.n_tokens - u.pos[j]) * u.stat[j];
        keep_best(score, 0, u.n, budget, keep);
    }

  private:
    std::shared_ptr<const RetentionGates> gates_;
};

}  // namespace

Result<std::unique_ptr<EvictionPolicy>> make_eviction_policy(const EvictionConfig& c) {
    DS_RETURN_IF_ERROR(c.validate());
    if (c.policy == "streaming") return std::unique_ptr<EvictionPolicy>(new Streaming(c.sinks));
    if (c.policy == "h2o") return std::unique_ptr<EvictionPolicy>(new H2O());
    if (c.policy == "snapkv") return std::unique_ptr<EvictionPolicy>(new SnapKV(c.window));
    if (c.policy == "keydiff") return std::unique_ptr<EvictionPolicy>(new KeyDiff());
    if (c.policy == "kvcompress") return std::unique_ptr<EvictionPolicy>(new KVCompress());
    if (c.policy == "d2o") return std::unique_ptr<EvictionPolicy>(new D2O());
    if (c.policy == "trimkv") {
        if (!c.gates)
            return invalid_argument(
                "the trimkv policy needs trained gates (--kv-profile trimkv.json)");
        return std::unique_ptr<EvictionPolicy>(new TrimKV(c.gates));
    }
    return invalid_argument("the " + c.policy + " policy does not evict");
}

}  // namespace deltaserve::kvstore
