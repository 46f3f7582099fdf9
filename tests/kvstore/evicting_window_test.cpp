// EvictingSequenceCache on a model whose layers mix sliding-window and global ones, with
// each policy: a window layer holds exactly the positions its window reaches and the slack
// before (every one of them, whatever the policy), its view sets the window and lists them
// with their data; the global layers keep what the same cache keeps for a model of the
// global layers alone (the budget counts and spreads over them only); the keep ratio of the
// global layers is met; a rewind past the held window keeps nothing; nothing leaks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "deltaserve/kvstore/evicting_cache.h"

namespace deltaserve::kvstore {
namespace {

constexpr int kKvHeads = 2, kHeads = 4, kDim = 8, kHidden = 12, kWindow = 20;
constexpr int kSlack = EvictingSequenceCache::kWindowSlack;
const kernels::AttentionShape kShape{kHeads, kKvHeads, kDim, 1.0f / std::sqrt(float(kDim))};
// The mixed model: layers 0 and 2 attend a window, 1 and 3 every token.
const std::vector<bool> kWindowLayers = {true, false, true, false};
const std::vector<int32_t> kGlobal = {1, 3};

std::unique_ptr<HeadSlotPool> make_pool(int32_t layers, int32_t slots) {
    HeadSlotPoolOptions o{layers, kKvHeads, kDim, slots, kernels::DType::kF32};
    auto p = HeadSlotPool::create(o);
    EXPECT_TRUE(p.ok());
    return std::move(*p);
}

// TRIM-KV gates alike in every layer, so that a model of the global layers alone gets those
// of the mixed model's global layers.
std::shared_ptr<const RetentionGates> gates(int32_t layers) {
    auto g = std::make_shared<RetentionGates>();
    g->d_model = kHidden;
    g->hidden = 8;
    g->n_kv_heads = kKvHeads;
    std::mt19937 rng(21);
    std::normal_distribution<float> nd(0.0f, 0.5f);
    RetentionGates::Layer w;
    for (int i = 0; i < 8 * kHidden; ++i) w.w1.push_back(nd(rng));
    w.b1.assign(8, 0.0f);
    for (int i = 0; i < kKvHeads * 8; ++i) w.w2.push_back(nd(rng));
    w.b2.assign(kKvHeads, 2.0f);
    g->layers.assign(static_cast<size_t>(layers), w);
    return g;
}

std::unique_ptr<EvictingSequenceCache> make_cache(HeadSlotPool& pool, const std::string& name,
                                                  float keep, std::vector<bool> window_layers) {
    EvictionConfig c;
    c.policy = name;
    c.keep = keep;
    c.window = 4;
    if (name == "trimkv") c.gates = gates(pool.options().n_layers);
    auto policy = make_eviction_policy(c);
    EXPECT_TRUE(policy.ok());
    return std::make_unique<EvictingSequenceCache>(pool, std::move(*policy), c,
                                                   std::move(window_layers), kWindow);
}

// Deterministic inputs per (position, model layer, what): K, V, Q and the hidden state.
std::vector<float> values(int32_t pos, int32_t layer, int what, size_t n) {
    std::mt19937 rng(static_cast<uint32_t>(pos * 1009 + layer * 31 + what));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> out(n);
    for (float& x : out) x = nd(rng);
    return out;
}

// A chunk of n tokens into a cache whose layer i is model layer layers[i].
void chunk(EvictingSequenceCache& c, const std::vector<int32_t>& layers, int32_t n,
           ThreadPool& threads) {
    ASSERT_TRUE(c.reserve(n).ok());
    const int32_t p0 = c.n_tokens();
    const int kvd = kKvHeads * kDim, qd = kHeads * kDim;
    for (size_t i = 0; i < layers.size(); ++i) {
        std::vector<float> k, v, q, h;
        const auto add = [&](std::vector<float>& out, int32_t pos, int what, int size) {
            const auto x = values(pos, layers[i], what, static_cast<size_t>(size));
            out.insert(out.end(), x.begin(), x.end());
        };
        for (int32_t t = 0; t < n; ++t) {
            add(k, p0 + t, 0, kvd);
            add(v, p0 + t, 1, kvd);
            add(q, p0 + t, 2, qd);
            add(h, p0 + t, 3, kHidden);
        }
        const auto layer = static_cast<int32_t>(i);
        ASSERT_TRUE(c.store(layer, 0, n, k.data(), v.data(), kvd).ok());
        ASSERT_TRUE(c.observe(layer, kShape, q.data(), qd, h.data(), kHidden, n, threads).ok());
    }
    ASSERT_TRUE(c.commit(n).ok());
}

// A window layer: every position from the slack before the next query's window (or from
// held_from, after a rewind), its view listing them with their K and V, the window set; a
// global layer's view without one.
void check_window_layers(const EvictingSequenceCache& c, int32_t max_chunk, int32_t held_from = 0) {
    const int32_t n = c.n_tokens();
    const int32_t first = std::max(held_from, n - kWindow + 1 - kSlack);
    for (int32_t layer = 0; layer < 4; ++layer) {
        const kernels::KvView view = c.view(layer, 0);
        EXPECT_EQ(view.window, kWindowLayers[layer] ? kWindow : 0);
        if (!kWindowLayers[layer]) continue;
        for (int32_t g = 0; g < kKvHeads; ++g) {
            const auto pos = c.positions(layer, g);
            ASSERT_EQ(static_cast<int32_t>(pos.size()), n - first) << "layer " << layer;
            for (size_t j = 0; j < pos.size(); ++j) {
                ASSERT_EQ(pos[j], first + static_cast<int32_t>(j));
                const int32_t slot = view.slots_of(g)[j];
                // Freed slots are taken again first: a window unit touches only its first ones.
                EXPECT_LT(slot, kWindow - 1 + kSlack + max_chunk);
                const auto* kr = reinterpret_cast<const float*>(view.k + slot * view.row_stride +
                                                                view.head_offset(g));
                const auto want = values(pos[j], layer, 0, kKvHeads * kDim);
                for (int d = 0; d < kDim; ++d) ASSERT_EQ(kr[d], want[g * kDim + d]);
            }
        }
    }
}

class WindowPolicyTest : public ::testing::TestWithParam<std::string> {};

TEST_P(WindowPolicyTest, WindowLayersHoldTheirWindowGlobalOnesTheBudget) {
    auto mixed_pool = make_pool(4, 400), alone_pool = make_pool(2, 400);
    auto mixed = make_cache(*mixed_pool, GetParam(), 0.4f, kWindowLayers);
    auto alone = make_cache(*alone_pool, GetParam(), 0.4f, {});
    ThreadPool threads(2);
    const std::vector<int32_t> all = {0, 1, 2, 3};
    int32_t steps = 0;
    for (int32_t n : {50, 7, 7, 1, 1, 40, 30, 1, 1, 1, 60}) {
        chunk(*mixed, all, n, threads);
        chunk(*alone, kGlobal, n, threads);
        ++steps;
        check_window_layers(*mixed, 60);
        // The global layers choose as a model without the window layers does.
        for (size_t i = 0; i < kGlobal.size(); ++i) {
            for (int32_t g = 0; g < kKvHeads; ++g) {
                const auto a = mixed->positions(kGlobal[i], g);
                const auto b = alone->positions(static_cast<int32_t>(i), g);
                ASSERT_EQ(std::vector<int32_t>(a.begin(), a.end()),
                          std::vector<int32_t>(b.begin(), b.end()))
                    << "layer " << kGlobal[i] << " head " << g << " after " << steps << " chunks";
            }
        }
    }
    const int32_t n = mixed->n_tokens();
    ASSERT_EQ(n, 199);
    // Past the window's slack: the window layers hold their window and slack, not the context.
    int64_t window_entries = 0, global_entries = 0;
    for (int32_t layer = 0; layer < 4; ++layer) {
        for (int32_t g = 0; g < kKvHeads; ++g) {
            (kWindowLayers[layer] ? window_entries : global_entries) +=
                static_cast<int64_t>(mixed->positions(layer, g).size());
        }
    }
    EXPECT_EQ(window_entries, 2 * kKvHeads * (kWindow - 1 + kSlack));
    // The keep ratio holds over the global layers (their K, V and metadata), the window
    // layers counted apart.
    const size_t units_state = 4 * kKvHeads * sizeof(float);
    const size_t entry =
        (mixed->bytes() - units_state) / static_cast<size_t>(window_entries + global_entries);
    const double global_full = double(full_fp16_bytes(n, 2, kKvHeads * kDim));
    EXPECT_LE(double(global_entries * entry), 0.4 * global_full);
    EXPECT_GT(double(global_entries * entry), 0.3 * global_full);
    EXPECT_EQ(alone->bytes() + size_t(window_entries) * entry + 2 * kKvHeads * sizeof(float),
              mixed->bytes());
    EXPECT_LE(mixed->bytes(), mixed->bytes_bound(n));
}

TEST_P(WindowPolicyTest, ARewindPastTheHeldWindowKeepsNothing) {
    auto pool = make_pool(4, 400);
    {
        auto c = make_cache(*pool, GetParam(), 0.5f, kWindowLayers);
        ThreadPool threads(2);
        const std::vector<int32_t> all = {0, 1, 2, 3};
        chunk(*c, all, 150, threads);
        chunk(*c, all, 1, threads);
        // The window layers hold positions from 151 - 20 + 1 - 64 = 68.
        EXPECT_EQ(c->positions(0, 0).front(), 68);
        EXPECT_EQ(c->kept_by_truncate(151), 151);
        EXPECT_EQ(c->kept_by_truncate(87), 87);  // its window starts at 68
        EXPECT_EQ(c->kept_by_truncate(86), 0);
        c->truncate(100);
        EXPECT_EQ(c->n_tokens(), 100);
        check_window_layers(*c, 150, 68);
        chunk(*c, all, 5, threads);  // it goes on from there
        check_window_layers(*c, 150, 68);
        c->truncate(50);
        EXPECT_EQ(c->n_tokens(), 0);
        EXPECT_EQ(c->bytes(), 4 * kKvHeads * sizeof(float));
        chunk(*c, all, 30, threads);  // and starts again from nothing
        check_window_layers(*c, 30);
    }
    for (int32_t u = 0; u < pool->n_units(); ++u) EXPECT_EQ(pool->free_slots(u), 400);
}

INSTANTIATE_TEST_SUITE_P(Policies, WindowPolicyTest,
                         ::testing::Values("streaming", "h2o", "snapkv", "keydiff", "kvcompress",
                                           "d2o", "trimkv"));

// Every layer a window layer: nothing is ranked, each keeps its window.
TEST(EvictingWindow, OnlyWindowLayers) {
    auto pool = make_pool(2, 300);
    auto c = make_cache(*pool, "h2o", 0.2f, {true, true});
    ThreadPool threads(2);
    chunk(*c, {0, 2}, 200, threads);
    for (int32_t layer = 0; layer < 2; ++layer) {
        const auto pos = c->positions(layer, 1);
        ASSERT_EQ(static_cast<int32_t>(pos.size()), kWindow - 1 + kSlack);
        EXPECT_EQ(pos.back(), 199);
    }
}

}  // namespace
}  // namespace deltaserve::kvstore
