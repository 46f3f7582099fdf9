// Sliding-window layers in the full policy's cache, on Gemma 3 270M (setup fetches it; 15
// local layers of window 512, 3 global): past the window a local layer holds its window, not
// the context, and the session's KV leaves and comes back exactly: shipped whole (a prefill
// node to a decode node), as stored blocks written turn by turn (the tiered store), and
// adopted block by block (the prefix cache). What cannot be continued exactly is refused or
// recomputed, never attended with rows missing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include "deltaserve/kvstore/evicting_cache.h"
#include "deltaserve/kvstore/kv_block.h"
#include "deltaserve/kvstore/kv_cache.h"
#include "deltaserve/kvstore/kv_rows_info.h"
#include "deltaserve/model/inference_context.h"
#include "deltaserve/model/kv_blocks.h"
#include "deltaserve/model/kv_groups.h"
#include "deltaserve/model/model.h"
#include "gemma_model.h"
#include "test_paths.h"

namespace deltaserve::model {
namespace {

constexpr int32_t kWindow = 512;

class WindowKv : public ::testing::Test {
  protected:
    void SetUp() override {
        model_ = testing::gemma_model();
        if (model_ == nullptr) GTEST_SKIP() << testing::kGemmaAbsent;
    }
    static std::unique_ptr<InferenceContext> context(const std::string& policy = "full",
                                                     float keep = 1.0f) {
        ContextOptions co;
        co.n_ctx = 2048;
        co.n_batch = 128;
        co.n_threads = 2;
        co.kv.policy = policy;
        co.kv.keep = keep;
        auto ctx = InferenceContext::create(*model_, co);
        EXPECT_TRUE(ctx.ok()) << ctx.error().to_string();
        return ctx.ok() ? std::move(*ctx) : nullptr;
    }
    // n token ids of the vocabulary's ordinary range, the same every run.
    static std::vector<int32_t> tokens(int32_t n, int32_t seed = 0) {
        std::vector<int32_t> t;
        for (int32_t i = 0; i < n; ++i) t.push_back(1000 + (i * 7919 + seed * 104729) % 30000);
        return t;
    }
    // The logits of `more` after what ctx holds, every one.
    static std::vector<float> next(InferenceContext& ctx, const std::vector<int32_t>& more) {
        auto all = ctx.eval_all(more);
        EXPECT_TRUE(all.ok()) << all.error().to_string();
        return all.ok() ? *all : std::vector<float>();
    }
    static inline Model* model_ = nullptr;
};

TEST_F(WindowKv, TheLayerGroupsOfGemma3) {
    auto g = kv_layer_groups(model_->config);
    ASSERT_TRUE(g.ok());
    EXPECT_EQ(g->window, kWindow);
    EXPECT_EQ(g->group_layers, 3);  // 3 global layers make a group, 15 local ones five
    EXPECT_EQ(g->n_groups(), 6);
    for (int32_t l = 0; l < 18; ++l) EXPECT_EQ(g->is_window_layer(l), l % 6 != 5) << l;
    // Gemma 3 1B's 26 layers (4 global) and 4B's 34 (5 global): groups of 4 and 5, the last
    // local group padded by 2 and 1 layers.
    std::vector<bool> one_b(26), four_b(34);
    for (size_t l = 0; l < one_b.size(); ++l) one_b[l] = l % 6 != 5;
    for (size_t l = 0; l < four_b.size(); ++l) four_b[l] = l % 6 != 5;
    EXPECT_EQ(kvstore::KvLayerGroups::make(one_b, 512)->group_layers, 4);
    EXPECT_EQ(kvstore::KvLayerGroups::make(one_b, 512)->n_groups(), 7);
    EXPECT_EQ(kvstore::KvLayerGroups::make(one_b, 512)->real_layers.back(), 2);
    auto four = kvstore::KvLayerGroups::make(four_b, 1024);
    EXPECT_EQ(four->group_layers, 5);
    EXPECT_EQ(four->n_groups(), 7);
    EXPECT_EQ(four->real_layers.back(), 4);  // 29 local layers in 6 groups of 5: one padded
}

// 1400 tokens in chunks of 128: the local layers hold about their window, the global ones
// every token.
TEST_F(WindowKv, ALocalLayerHoldsItsWindow) {
    auto ctx = context();
    ASSERT_NE(ctx, nullptr);
    next(*ctx, tokens(1400));
    const size_t row = static_cast<size_t>(model_->config.kv_dim()) * 2 * 2;  // fp16 K and V
    const size_t global = 3 * 1400 * row;
    const size_t every = 18 * 1400 * row;
    // Each local layer: the window, the 64 positions of slack, the last chunk (128) and at
    // most a block more.
    EXPECT_LE(ctx->kv_bytes(), global + 15 * (kWindow + 64 + 128 + 16) * row);
    EXPECT_GE(ctx->kv_bytes(), global + 15 * kWindow * row);
    EXPECT_LE(ctx->kv_held_bytes(), ctx->kv_bytes_bound(1400));
    std::printf("1400 tokens: %zu KV bytes, %.2f of every layer's rows\n", ctx->kv_bytes(),
                static_cast<double>(ctx->kv_bytes()) / static_cast<double>(every));
    // What a worker books is bounded the same way (a block per group more).
    EXPECT_LT(ctx->kv_bytes_bound(1400), every * 2 / 3);
}

// The evicting policies past the window: 1200 tokens in chunks of 128 and a few steps; the
// global layers hold the keep ratio of their tokens, the local ones their window and the
// slack, every one.
TEST_F(WindowKv, EvictingPoliciesHoldTheGlobalBudgetAndTheWindows) {
    const ModelConfig& c = model_->config;
    auto full = context();
    ASSERT_NE(full, nullptr);
    ASSERT_TRUE(full->eval(tokens(1200)).ok());
    const auto slack = kvstore::EvictingSequenceCache::kWindowSlack;
    const size_t local = 15 * static_cast<size_t>(c.n_kv_heads) * (kWindow - 1 + slack);
    const size_t entry = 4 * static_cast<size_t>(c.head_dim) + 8;  // fp16 K, V; slot, position
    for (const char* policy : {"streaming", "h2o"}) {
        auto ctx = context(policy, 0.5f);
        ASSERT_NE(ctx, nullptr);
        auto l = ctx->eval(tokens(1200));
        ASSERT_TRUE(l.ok()) << policy << ": " << l.error().to_string();
        for (int32_t step = 0; step < 4; ++step) {
            const int32_t next[] = {
                static_cast<int32_t>(std::max_element(l->begin(), l->end()) - l->begin())};
            l = ctx->eval(next);
            ASSERT_TRUE(l.ok()) << policy;
        }
        const int32_t n = ctx->n_past();
        const size_t global = kvstore::full_fp16_bytes(n, 3, c.kv_dim()) / 2;
        const size_t units = static_cast<size_t>(18 * c.n_kv_heads) * sizeof(float);
        EXPECT_LE(ctx->kv_bytes(), global + local * (entry + 4) + units) << policy;
        EXPECT_GE(ctx->kv_bytes(), local * entry) << policy;
        EXPECT_LE(ctx->kv_bytes(), ctx->kv_bytes_bound(n)) << policy;
        EXPECT_LT(ctx->kv_bytes(), full->kv_bytes()) << policy;
        std::printf(
            "%-9s %d tokens at keep 0.5: %zu KV bytes (full: %zu at 1200), keep_ratio "
            "%.3f\n",
            policy, n, ctx->kv_bytes(), full->kv_bytes(), ctx->keep_ratio());
    }
}

// Shipped whole (export_state and every layer), then both go on alike: the same bits.
TEST_F(WindowKv, ShippedWholeContinuesExactly) {
    auto a = context(), b = context();
    ASSERT_TRUE(a && b);
    next(*a, tokens(900));
    auto state = a->export_kv_state();
    ASSERT_TRUE(state.ok()) << state.error().to_string();
    ASSERT_TRUE(b->import_kv_state(*state).ok());
    for (int32_t l = 0; l < model_->config.n_layers; ++l) {
        auto part = a->export_kv_layer(l);
        ASSERT_TRUE(part.ok()) << part.error().to_string();
        ASSERT_TRUE(b->import_kv_layer(l, *part).ok()) << l;
    }
    EXPECT_EQ(a->kv_bytes(), b->kv_bytes());
    EXPECT_EQ(next(*a, tokens(20, 1)), next(*b, tokens(20, 1)));
    // A local layer's part lacking the window's first rows is refused.
    auto c = context();
    ASSERT_TRUE(c->import_kv_state(*state).ok());
    auto part = a->export_kv_layer(0);
    ASSERT_TRUE(part.ok());
    std::vector<uint8_t> cut(part->begin(), part->end());
    int32_t first = 0;
    std::memcpy(&first, cut.data(), 4);
    const size_t row = static_cast<size_t>(model_->config.kv_dim()) * 2;
    const int32_t later = first + 16;
    const auto n_old = static_cast<size_t>(920 - first), n_new = static_cast<size_t>(920 - later);
    std::vector<uint8_t> shorter(4 + 2 * n_new * row);
    std::memcpy(shorter.data(), &later, 4);
    std::memcpy(shorter.data() + 4, cut.data() + 4 + 16 * row, n_new * row);
    std::memcpy(shorter.data() + 4 + n_new * row, cut.data() + 4 + (n_old + 16) * row, n_new * row);
    const Status refused = c->import_kv_layer(0, shorter);
    EXPECT_EQ(refused.code(), StatusCode::kDataLoss) << refused.to_string();
}

// The tiered store's blocks, written as the session grows (each turn's new ones only), then
// read back into an empty context: it goes on exactly as the session does.
TEST_F(WindowKv, StoredBlocksWrittenTurnByTurnRestoreExactly) {
    auto a = context();
    ASSERT_NE(a, nullptr);
    std::vector<int32_t> history;
    KvBlocksOptions o;
    o.fingerprint = 7;
    o.root = 7;
    o.block_tokens = 256;
    std::vector<std::vector<uint8_t>> store;
    for (int32_t turn = 0; turn < 3; ++turn) {
        const auto more = tokens(turn == 0 ? 300 : 350, turn);
        next(*a, more);
        history.insert(history.end(), more.begin(), more.end());
        // Whole blocks are written once; the last, partial one again each turn.
        o.first_block = static_cast<int32_t>(store.size());
        if (!store.empty() && history.size() - more.size() <
                                  static_cast<size_t>(store.size()) * 256)  // a partial block
            o.first_block = static_cast<int32_t>(store.size()) - 1;
        auto out = export_kv_blocks(*a, history, o);
        ASSERT_TRUE(out.ok()) << out.error().to_string();
        store.resize(static_cast<size_t>(o.first_block));
        for (auto& b : out->blocks) store.push_back(std::move(b));
    }
    auto b = context();
    std::vector<std::span<const uint8_t>> views(store.begin(), store.end());
    const Status s = import_kv_blocks(*b, views, {}, o);
    ASSERT_TRUE(s.ok()) << s.to_string();
    EXPECT_EQ(b->n_past(), 1000);
    EXPECT_EQ(next(*a, tokens(20, 9)), next(*b, tokens(20, 9)));
    const auto after = tokens(20, 9);
    history.insert(history.end(), after.begin(), after.end());
    // Written at the end instead, the early blocks carry no local rows (the window left
    // them): the whole session still restores, but its first 512 tokens alone, whose window
    // needs the first block's, are refused, and the context is left empty.
    o.first_block = 0;
    auto at_end = export_kv_blocks(*a, history, o);
    ASSERT_TRUE(at_end.ok()) << at_end.error().to_string();
    std::vector<std::span<const uint8_t>> all(at_end->blocks.begin(), at_end->blocks.end());
    auto c = context();
    ASSERT_TRUE(import_kv_blocks(*c, all, {}, o).ok());
    EXPECT_EQ(next(*a, tokens(4, 10)), next(*c, tokens(4, 10)));
    // What a tool reads of them without a cache (deltactl session describe): the first
    // block's local layers hold none of its tokens, its global layers all.
    auto first = kvstore::parse_kv_block(all[0], o.fingerprint);
    ASSERT_TRUE(first.ok()) << first.error().to_string();
    const kvstore::KvBlockMeta& m = first->meta;
    auto local =
        kvstore::kv_rows_info(m.codec, m.codec_state, 0, m.begin, m.end, first->parts[0], true);
    auto global =
        kvstore::kv_rows_info(m.codec, m.codec_state, 5, m.begin, m.end, first->parts[5], true);
    ASSERT_TRUE(local.ok() && global.ok());
    EXPECT_EQ(local->dropped, 256);
    EXPECT_EQ(local->exact_bytes, 4u) << "no rows: its first position only";
    EXPECT_TRUE(local->window);
    EXPECT_FALSE(global->window);
    EXPECT_EQ(local->kinds.back(), kvstore::KvRowsInfo::Kind::kDropped);
    EXPECT_EQ(global->dropped, 0);
    EXPECT_EQ(global->buffer, 256);
    auto d = context();
    const Status part = import_kv_blocks(*d, std::span(all).first(2), {}, o);
    EXPECT_EQ(part.code(), StatusCode::kDataLoss) << part.to_string();
    EXPECT_EQ(d->n_past(), 0);
}

// A turn may rewind a few tokens (its template renders the last answer again); further back,
// the local layers no longer hold the window there, and the context says so: it keeps nothing
// and the turn recomputes.
TEST_F(WindowKv, RewindingPastTheHeldWindowKeepsNothing) {
    auto ctx = context();
    ASSERT_NE(ctx, nullptr);
    const auto prompt = tokens(1000);
    next(*ctx, prompt);
    EXPECT_EQ(ctx->kept_by_truncate(990), 990);
    EXPECT_EQ(ctx->kept_by_truncate(400), 0);
    // A rewind within the slack gives what recomputing gives.
    ctx->truncate(990);
    EXPECT_EQ(ctx->n_past(), 990);
    auto fresh = context();
    next(*fresh, std::vector<int32_t>(prompt.begin(), prompt.begin() + 990));
    EXPECT_EQ(next(*ctx, tokens(8, 3)), next(*fresh, tokens(8, 3)));
    ctx->truncate(400);
    EXPECT_EQ(ctx->n_past(), 0);
    EXPECT_EQ(ctx->kv_held_bytes(), 0u);
}

}  // namespace
}  // namespace deltaserve::model
