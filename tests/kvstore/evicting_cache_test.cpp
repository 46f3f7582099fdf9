// EvictingSequenceCache with each policy, driven the way the forward pass drives it
// (reserve, store, observe, commit) with random K/V/Q: budgets held, the tokens a policy
// promises to keep are kept, views list exactly the kept entries with their own data, the
// ranking equals a direct computation, nothing leaks, runs repeat exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>

#include "deltaserve/kvstore/evicting_cache.h"

namespace deltaserve::kvstore {
namespace {

constexpr int kLayers = 2, kKvHeads = 2, kHeads = 4, kDim = 8, kHidden = 12;
const kernels::AttentionShape kShape{kHeads, kKvHeads, kDim, 1.0f / std::sqrt(float(kDim))};

std::unique_ptr<HeadSlotPool> make_pool(int32_t slots) {
    HeadSlotPoolOptions o{kLayers, kKvHeads, kDim, slots, kernels::DType::kF32};
    auto p = HeadSlotPool::create(o);
    EXPECT_TRUE(p.ok());
    return std::move(*p);
}

// Random TRIM-KV gates for the test model (retention around 0.9).
std::shared_ptr<const RetentionGates> random_gates() {
    auto g = std::make_shared<RetentionGates>();
    g->d_model = kHidden;
    g->hidden = 8;
    g->n_kv_heads = kKvHeads;
    std::mt19937 rng(21);
    std::normal_distribution<float> nd(0.0f, 0.5f);
    for (int l = 0; l < kLayers; ++l) {
        RetentionGates::Layer w;
        for (int i = 0; i < 8 * kHidden; ++i) w.w1.push_back(nd(rng));
        w.b1.assign(8, 0.0f);
        for (int i = 0; i < kKvHeads * 8; ++i) w.w2.push_back(nd(rng));
        w.b2.assign(kKvHeads, 2.0f);
        g->layers.push_back(w);
    }
    return g;
}

std::unique_ptr<EvictingSequenceCache> make_cache(HeadSlotPool& pool, const std::string& name,
                                                  float keep) {
    EvictionConfig c;
    c.policy = name;
    c.keep = keep;
    c.window = 4;
    if (name == "trimkv") c.gates = random_gates();
    auto policy = make_eviction_policy(c);
    EXPECT_TRUE(policy.ok());
    return std::make_unique<EvictingSequenceCache>(pool, std::move(*policy), c);
}

// The K/V of every position, so what the cache returns can be checked against them.
struct Feed {
    std::mt19937 rng{3};
    std::normal_distribution<float> nd{0.0f, 1.0f};
    std::map<int32_t, std::vector<float>> k, v;  // position -> [layers][kv_dim]
    ThreadPool threads{2};

    void chunk(EvictingSequenceCache& c, int32_t n) {
        ASSERT_TRUE(c.reserve(n).ok());
        const int32_t p0 = c.n_tokens();
        const int kvd = kKvHeads * kDim;
        std::vector<float> kk(static_cast<size_t>(n) * kvd), vv(kk.size()),
            q(static_cast<size_t>(n) * kHeads * kDim);
        std::vector<float> h(static_cast<size_t>(n) * kHidden);
        for (int32_t layer = 0; layer < kLayers; ++layer) {
            for (int32_t i = 0; i < n; ++i) {
                auto& kp = k[p0 + i];
                auto& vp = v[p0 + i];
                kp.resize(kLayers * kvd);
                vp.resize(kLayers * kvd);
                for (int d = 0; d < kvd; ++d) {
                    kk[i * kvd + d] = kp[layer * kvd + d] = nd(rng);
                    vv[i * kvd + d] = vp[layer * kvd + d] = nd(rng);
                }
            }
            for (auto& x : q) x = nd(rng);
            for (auto& x : h) x = nd(rng);
            EXPECT_TRUE(c.store(layer, 0, n, kk.data(), vv.data(), kvd).ok());
            EXPECT_TRUE(
                c.observe(layer, kShape, q.data(), kHeads * kDim, h.data(), kHidden, n, threads)
                    .ok());
        }
        EXPECT_TRUE(c.commit(n).ok());
    }
    const float* key(int32_t pos, int32_t layer, int32_t g) const {
        return k.at(pos).data() + (layer * kKvHeads + g) * kDim;
    }
    const float* value(int32_t pos, int32_t layer, int32_t g) const {
        return v.at(pos).data() + (layer * kKvHeads + g) * kDim;
    }
};

// Every (layer, head): positions increasing and in range, at most the budget (when the
// policy shrank the cache on this commit), and the view lists exactly those entries with the
// data stored for their positions.
void check_invariants(const EvictingSequenceCache& c, const Feed& f, bool shrunk,
                      bool per_unit_budget = true, bool data_unchanged = true) {
    int64_t total = 0;
    for (int32_t layer = 0; layer < kLayers; ++layer) {
        for (int32_t g = 0; g < kKvHeads; ++g)
            total += static_cast<int64_t>(c.positions(layer, g).size());
    }
    if (shrunk) {
        EXPECT_LE(total, static_cast<int64_t>(c.budget(c.n_tokens())) * kLayers * kKvHeads)
            << "total budget";
    }
    for (int32_t layer = 0; layer < kLayers; ++layer) {
        const kernels::KvView view = c.view(layer, 0);
        for (int32_t g = 0; g < kKvHeads; ++g) {
            const auto pos = c.positions(layer, g);
            if (shrunk && per_unit_budget) {
                EXPECT_LE(static_cast<int32_t>(pos.size()), c.budget(c.n_tokens()));
            }
            ASSERT_EQ(view.n_of(g), static_cast<int32_t>(pos.size()));
            std::set<int32_t> slots;
            for (size_t j = 0; j < pos.size(); ++j) {
                ASSERT_GE(pos[j], 0);
                ASSERT_LT(pos[j], c.n_tokens());
                if (j > 0) {
                    ASSERT_LT(pos[j - 1], pos[j]);
                }
                const int32_t slot = view.slots_of(g)[j];
                EXPECT_TRUE(slots.insert(slot).second) << "slot listed twice";
                const auto* kr = reinterpret_cast<const float*>(view.k + slot * view.row_stride +
                                                                view.head_offset(g));
                const auto* vr = reinterpret_cast<const float*>(view.v + slot * view.row_stride +
                                                                view.head_offset(g));
                for (int d = 0; d < kDim && data_unchanged; ++d) {
                    ASSERT_EQ(kr[d], f.key(pos[j], layer, g)[d]) << "K of position " << pos[j];
                    ASSERT_EQ(vr[d], f.value(pos[j], layer, g)[d]) << "V of position " << pos[j];
                }
            }
        }
    }
}

bool has_all(std::span<const int32_t> pos, int32_t from, int32_t to) {
    for (int32_t p = from; p < to; ++p) {
        if (!std::binary_search(pos.begin(), pos.end(), p)) return false;
    }
    return true;
}

class PolicyTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PolicyTest, BudgetsRangesDataAndPromises) {
    auto pool = make_pool(256);
    auto c = make_cache(*pool, GetParam(), 0.4f);
    Feed f;
    // SnapKV compresses prompts (chunks of 2+ tokens) only: decode steps add to its cache.
    const bool continual = GetParam() != "snapkv";
    for (int32_t n : {40, 24, 1, 1, 1, 30}) {
        f.chunk(*c, n);
        const bool uniform = GetParam() != "kvcompress" && GetParam() != "d2o";
        check_invariants(*c, f, continual || n > 1, uniform, GetParam() != "d2o");
        const int32_t b = c->budget(c->n_tokens());
        for (int32_t layer = 0; layer < kLayers; ++layer) {
            for (int32_t g = 0; g < kKvHeads; ++g) {
                const auto pos = c->positions(layer, g);
                const int32_t t = c->n_tokens();
                if (GetParam() == "streaming") {
                    EXPECT_TRUE(has_all(pos, 0, 4)) << "sinks";
                    EXPECT_TRUE(has_all(pos, t - (b - 4), t)) << "recent window";
                } else if (GetParam() == "h2o") {
                    EXPECT_TRUE(has_all(pos, t - b / 2, t)) << "recent half";
                } else if (GetParam() == "snapkv" && n > 1) {
                    EXPECT_TRUE(has_all(pos, t - 4, t)) << "observation window";
                } else if (GetParam() == "d2o") {
                    const int32_t kept = static_cast<int32_t>(pos.size()),
                                  sinks = std::min(4, kept);
                    EXPECT_TRUE(has_all(pos, 0, sinks)) << "sinks";
                    EXPECT_TRUE(has_all(pos, t - (kept - sinks) / 2, t)) << "recent window";
                } else if (GetParam() == "kvcompress") {
                    const int32_t protect = std::min(32, b);  // at most an even share of the budget
                    EXPECT_TRUE(has_all(pos, t - protect, t)) << "the newest tokens are protected";
                }
            }
        }
    }
    // The keep ratio is met with metadata counted.
    EXPECT_LE(double(c->bytes()),
              0.4 * full_fp16_bytes(c->n_tokens(), kLayers, kKvHeads * kDim) + 1e-9);
    EXPECT_GT(double(c->bytes()), 0.3 * full_fp16_bytes(c->n_tokens(), kLayers, kKvHeads * kDim));
}

TEST_P(PolicyTest, SameInputsSameChoices) {
    std::vector<std::vector<int32_t>> runs[2];
    for (auto& run : runs) {
        auto pool = make_pool(128);
        auto c = make_cache(*pool, GetParam(), 0.3f);
        Feed f;
        f.chunk(*c, 50);
        f.chunk(*c, 1);
        for (int32_t g = 0; g < kKvHeads; ++g)
            run.emplace_back(c->positions(1, g).begin(), c->positions(1, g).end());
    }
    EXPECT_EQ(runs[0], runs[1]);
}

TEST_P(PolicyTest, NothingLeaksAndTruncateFrees) {
    auto pool = make_pool(100);
    {
        auto c = make_cache(*pool, GetParam(), 0.5f);
        Feed f;
        f.chunk(*c, 60);
        c->truncate(20);
        EXPECT_EQ(c->n_tokens(), 20);
        for (int32_t g = 0; g < kKvHeads; ++g) {
            for (int32_t p : c->positions(0, g)) EXPECT_LT(p, 20);
        }
        // A reserve that does not fit takes nothing.
        std::vector<int32_t> free_before;
        for (int32_t u = 0; u < pool->n_units(); ++u) free_before.push_back(pool->free_slots(u));
        EXPECT_EQ(c->reserve(1000).code(), StatusCode::kResourceExhausted);
        for (int32_t u = 0; u < pool->n_units(); ++u)
            EXPECT_EQ(pool->free_slots(u), free_before[u]);
    }
    for (int32_t u = 0; u < pool->n_units(); ++u) EXPECT_EQ(pool->free_slots(u), 100);
}

INSTANTIATE_TEST_SUITE_P(Policies, PolicyTest,
                         ::testing::Values("streaming", "h2o", "snapkv", "keydiff", "kvcompress",
                                           "d2o", "trimkv"));

// KeyDiff keeps the keys least similar to the mean normalised key: the same set as a direct
// computation over the keys present before the cut.
TEST(KeyDiffPolicy, KeepsTheKeysFarthestFromTheMeanDirection) {
    auto pool = make_pool(128);
    auto c = make_cache(*pool, "keydiff", 0.3f);
    Feed f;
    f.chunk(*c, 60);
    const int32_t b = c->budget(60);
    for (int32_t layer = 0; layer < kLayers; ++layer) {
        for (int32_t g = 0; g < kKvHeads; ++g) {
            std::vector<double> anchor(kDim, 0.0);
            std::vector<std::vector<double>> unit(60);
            for (int32_t p = 0; p < 60; ++p) {
                double n2 = 0;
                for (int d = 0; d < kDim; ++d)
                    n2 += double(f.key(p, layer, g)[d]) * f.key(p, layer, g)[d];
                for (int d = 0; d < kDim; ++d) {
                    unit[p].push_back(f.key(p, layer, g)[d] / std::sqrt(n2));
                    anchor[d] += unit[p][d];
                }
            }
            std::vector<std::pair<double, int32_t>> score;
            for (int32_t p = 0; p < 60; ++p) {
                double dot = 0;
                for (int d = 0; d < kDim; ++d) dot += unit[p][d] * anchor[d];
                score.emplace_back(dot, p);
            }
            std::sort(score.begin(), score.end());
            std::vector<int32_t> want;
            for (int32_t i = 0; i < b; ++i) want.push_back(score[i].second);
            std::sort(want.begin(), want.end());
            const auto got = c->positions(layer, g);
            EXPECT_EQ(std::vector<int32_t>(got.begin(), got.end()), want)
                << "layer " << layer << " head " << g;
        }
    }
}

// KV-Compress spends one budget over all heads: heads whose attention is spread out keep
// more than heads that attend to a few tokens, and the total is what a uniform budget gives.
TEST(KVCompressPolicy, BudgetsVaryPerHeadWithinTheTotal) {
    auto pool = make_pool(400);
    auto c = make_cache(*pool, "kvcompress", 0.3f);
    Feed f;
    f.chunk(*c, 300);
    std::set<size_t> sizes;
    size_t total = 0;
    for (int32_t layer = 0; layer < kLayers; ++layer) {
        for (int32_t g = 0; g < kKvHeads; ++g) {
            sizes.insert(c->positions(layer, g).size());
            total += c->positions(layer, g).size();
        }
    }
    EXPECT_GT(sizes.size(), 1u) << "budgets differ between heads";
    EXPECT_LE(total, static_cast<size_t>(c->budget(300)) * kLayers * kKvHeads);
    EXPECT_GE(total + 16 * kLayers * kKvHeads,
              static_cast<size_t>(c->budget(300)) * kLayers * kKvHeads)
        << "within one block per unit of the total";
}

// D2O's merge: an evicted key close to a kept one (above the EMA threshold) is folded into
// it with weights exp(u) / (exp(u) + e) and e / (exp(u) + e); a dissimilar one is dropped.
struct FixedKeys final : UnitView {
    std::vector<std::vector<float>> keys;
    void key(int32_t j, float* out) const override {
        std::copy(keys[j].begin(), keys[j].end(), out);
    }
};

TEST(D2OPolicy, MergesOnlySimilarEvictedKeys) {
    EvictionConfig c;
    c.policy = "d2o";
    auto p = make_eviction_policy(c);
    ASSERT_TRUE(p.ok());
    FixedKeys u;
    u.keys = {{1, 0, 0, 0},
              {0, 1, 0, 0},
              {0.99f, 0.1f, 0, 0},
              {0, 0, 1, 0}};  // kept, kept, near 0, apart
    u.n = 4;
    u.head_dim = 4;
    float tau = 0.0f;
    u.state = &tau;
    const std::vector<uint8_t> keep = {1, 1, 0, 0};
    const auto m = (*p)->merges(u, keep);
    ASSERT_EQ(m.size(), 1u);
    EXPECT_EQ(m[0].from, 2);
    EXPECT_EQ(m[0].to, 0);
    const double cosine = 0.99 / std::sqrt(0.99 * 0.99 + 0.01);
    EXPECT_NEAR(m[0].w_from, std::exp(cosine) / (std::exp(cosine) + std::exp(1.0)), 1e-5);
    EXPECT_NEAR(m[0].w_to, std::exp(1.0) / (std::exp(cosine) + std::exp(1.0)), 1e-5);
    EXPECT_NEAR(tau, cosine / 2, 1e-5)
        << "first round: the threshold starts at the mean best similarity";
}

// TRIM-KV keeps the tokens whose retention has decayed least: (t - i) log beta_i highest.
TEST(TrimKVPolicy, KeepsTheLeastDecayed) {
    EvictionConfig c;
    c.policy = "trimkv";
    c.gates = random_gates();
    auto p = make_eviction_policy(c);
    ASSERT_TRUE(p.ok());
    FixedKeys u;
    const std::vector<int32_t> pos = {0, 3, 7, 8, 9};
    const std::vector<float> log_beta = {-0.001f, -0.5f, -0.01f, -2.0f, -0.3f};
    u.n = 5;
    u.pos = pos.data();
    u.stat = log_beta.data();
    u.n_tokens = 10;
    // scores: -0.010, -3.5, -0.03, -4.0, -0.3 -> keep positions 0, 7, 9
    std::vector<uint8_t> keep(5, 0);
    (*p)->select(u, 3, keep);
    EXPECT_EQ(keep, (std::vector<uint8_t>{1, 0, 1, 0, 1}));
    c.gates = nullptr;
    EXPECT_EQ(make_eviction_policy(c).status().code(), StatusCode::kInvalidArgument)
        << "no gates, no trimkv";
}

TEST(EvictionPolicy, UnknownNamesAndBadRatiosAreRejected) {
    EvictionConfig c;
    c.policy = "magic";
    EXPECT_EQ(make_eviction_policy(c).status().code(), StatusCode::kInvalidArgument);
    c.policy = "h2o";
    c.keep = 0.0f;
    EXPECT_EQ(make_eviction_policy(c).status().code(), StatusCode::kInvalidArgument);
    c.keep = 1.5f;
    EXPECT_EQ(make_eviction_policy(c).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace deltaserve::kvstore
