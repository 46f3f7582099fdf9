// Shipping a session's KV between contexts, as a prefill node does to a decode node: the
// receiver, given the exported state and layers (or the rows the prefill shipped layer by
// layer while it ran), continues exactly as the sender would (bit-identical logits), and a
// DeltaKV session ships what it holds, not full KV.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <span>

#include "default_model.h"
#include "deltaserve/model/inference_context.h"
#include "deltaserve/model/sampler.h"
#include "test_paths.h"

namespace deltaserve::model {
namespace {

class KvShipping : public testing::DefaultModelTest {
  protected:
    // "deltakv_exact": DeltaKV keeping 2% of what it compresses exact (--kv-exact), whose
    // rows of a chunk's compressed blocks are final only once its judging layers ran.
    static std::unique_ptr<InferenceContext> context(const std::string& policy) {
        ContextOptions co;
        co.n_ctx = 2048;
        co.n_threads = 2;
        co.kv.policy = policy == "deltakv_exact" ? "deltakv" : policy;
        co.kv.keep = policy == "full" ? 1.0f : 0.3f;
        if (policy == "deltakv_exact") co.deltakv_exact = 0.02f;
        co.kv_profile = testing::default_deltakv_profile();
        auto c = InferenceContext::create(*model_, co);
        EXPECT_TRUE(c.ok()) << c.error().to_string();
        return c.ok() ? std::move(*c) : nullptr;
    }
    // The reconstruction errors measured at compression travel with the session.
    static void expect_same_errors(const InferenceContext& sender,
                                   const InferenceContext& receiver) {
        const std::vector<float> a = sender.kv_rows_error(0, sender.n_past()),
                                 b = receiver.kv_rows_error(0, receiver.n_past());
        ASSERT_EQ(a.size(), b.size());
        EXPECT_EQ(std::memcmp(a.data(), b.data(), 4 * a.size()), 0);
    }
    static int32_t n_layers() { return model_->config.n_layers; }
    // The receiver, holding what the sender shipped, goes on exactly as the sender: the
    // next 100 tokens, then 16 greedy steps, bit-identical logits.
    static void expect_same_continuation(InferenceContext& sender, InferenceContext& receiver,
                                         std::span<const int32_t> next_chunk) {
        auto a = sender.eval(next_chunk);
        auto b = receiver.eval(next_chunk);
        ASSERT_TRUE(a.ok() && b.ok());
        for (int step = 0; step < 16; ++step) {
            ASSERT_EQ(std::vector<float>(a->begin(), a->end()),
                      std::vector<float>(b->begin(), b->end()))
                << "step " << step;
            const int32_t next = greedy(*a);
            a = sender.eval({&next, 1});
            b = receiver.eval({&next, 1});
            ASSERT_TRUE(a.ok() && b.ok());
        }
    }
};

class KvShippingTest : public KvShipping, public ::testing::WithParamInterface<const char*> {};

TEST_P(KvShippingTest, ReceiverContinuesExactlyAsTheSender) {
    auto sender = context(GetParam());
    auto receiver = context(GetParam());
    ASSERT_TRUE(sender && receiver);
    const auto tokens = text_tokens(1300);
    for (size_t at = 0; at < 1200; at += 300) {  // chunked prefill; DeltaKV compresses
        ASSERT_TRUE(sender->eval({tokens.data() + at, 300}).ok());
    }

    auto state = sender->export_kv_state();
    ASSERT_TRUE(state.ok()) << state.error().to_string();
    const int32_t n_layers = KvShipping::n_layers();
    std::vector<std::vector<uint8_t>> layers;
    size_t shipped = state->size();
    for (int32_t l = 0; l < n_layers; ++l) {
        auto part = sender->export_kv_layer(l);
        ASSERT_TRUE(part.ok()) << part.error().to_string();
        shipped += part->size();
        layers.push_back(std::move(*part));
    }
    // What travels is what the session holds (bytes() also counts DeltaKV's position maps;
    // the states are a few bytes).
    EXPECT_LE(shipped, sender->kv_bytes() + 64);
    EXPECT_GE(shipped, sender->kv_bytes() * 9 / 10);

    ASSERT_TRUE(receiver->import_kv_state(*state).ok());
    EXPECT_EQ(receiver->n_past(), sender->n_past());
    for (int32_t l = n_layers - 1; l >= 0; --l) {  // any order
        Status s = receiver->import_kv_layer(l, layers[l]);
        ASSERT_TRUE(s.ok()) << s.to_string();
    }
    EXPECT_EQ(receiver->kv_bytes(), sender->kv_bytes());
    expect_same_errors(*sender, *receiver);

    expect_same_continuation(*sender, *receiver, {tokens.data() + 1200, 100});
}

// One layer's rows [begin, end) as a prefill node ships them from the layer observer.
struct RowsPart {
    int32_t layer, begin, end;
    std::vector<uint8_t> bytes;
    bool during_last_chunk;
};

// Prefills `tokens` in chunks of `chunk` and collects, from the layer observer, each
// layer's rows as they become final, and after the last chunk the rest.
std::vector<RowsPart> prefill_shipping_rows(InferenceContext& ctx, std::span<const int32_t> tokens,
                                            int32_t chunk) {
    const int32_t n = static_cast<int32_t>(tokens.size());
    const int32_t n_layers = ctx.model().config.n_layers;
    std::vector<int32_t> shipped(static_cast<size_t>(n_layers), 0);
    std::vector<RowsPart> parts;
    int32_t e = 0;
    bool done = false;
    const auto ship = [&](int32_t layer) {
        const int32_t end = done ? n : ctx.kv_rows_final_end(layer, e == n);
        int32_t& begin = shipped[static_cast<size_t>(layer)];
        if (end <= begin) return;
        auto rows = ctx.export_kv_rows(layer, begin, end);
        ASSERT_TRUE(rows.ok()) << rows.error().to_string();
        parts.push_back({layer, begin, end, std::move(*rows), e == n});
        begin = end;
    };
    // A layer's rows may become final at a later layer (DeltaKV keeping tokens exact).
    ctx.set_layer_observer([&](int32_t layer) {
        for (int32_t l = 0; l <= layer; ++l) ship(l);
    });
    for (int32_t b = 0; b < n; b = e) {
        e = std::min(n, b + chunk);
        EXPECT_TRUE(
            ctx.eval(tokens.subspan(static_cast<size_t>(b), static_cast<size_t>(e - b))).ok());
    }
    ctx.set_layer_observer(nullptr);
    done = true;
    for (int32_t l = 0; l < n_layers; ++l) ship(l);
    return parts;
}

TEST_P(KvShippingTest, RowsShippedWhileThePrefillRunsContinueExactly) {
    auto sender = context(GetParam());
    auto receiver = context(GetParam());
    ASSERT_TRUE(sender && receiver);
    const auto tokens = text_tokens(1300);
    auto state = sender->export_kv_rows_state(1200);
    ASSERT_TRUE(state.ok()) << state.error().to_string();
    auto parts = prefill_shipping_rows(*sender, {tokens.data(), 1200}, 300);
    ASSERT_FALSE(HasFailure());

    // Most bytes were ready while the prefill still had chunks to run, and what travels is
    // what the session holds: a compressing cache ships its latents, not full KV.
    size_t shipped = state->size(), early = 0;
    for (const auto& p : parts) {
        shipped += p.bytes.size();
        if (!p.during_last_chunk) early += p.bytes.size();
    }
    EXPECT_GT(early, shipped / 2);
    EXPECT_LE(shipped, sender->kv_bytes() + 64 * static_cast<size_t>(n_layers()) * 4);
    EXPECT_GE(shipped, sender->kv_bytes() * 9 / 10);

    // Layers in any order (here the last layer's parts first), each layer's ranges in order.
    ASSERT_TRUE(receiver->import_kv_state(*state).ok());
    std::stable_sort(parts.begin(), parts.end(),
                     [](const RowsPart& a, const RowsPart& b) { return a.layer > b.layer; });
    for (const auto& p : parts) {
        Status s = receiver->import_kv_rows(p.layer, p.begin, p.end, p.bytes);
        ASSERT_TRUE(s.ok()) << "layer " << p.layer << " [" << p.begin << ", " << p.end
                            << "): " << s.to_string();
    }
    EXPECT_EQ(receiver->kv_bytes(), sender->kv_bytes());
    expect_same_errors(*sender, *receiver);
    expect_same_continuation(*sender, *receiver, {tokens.data() + 1200, 100});
}

TEST_F(KvShipping, DeltaKvRowsThatDisagreeBetweenLayersAreRefused) {
    auto sender = context("deltakv_exact");
    ASSERT_TRUE(sender);
    const auto tokens = text_tokens(900);
    auto state = sender->export_kv_rows_state(900);
    ASSERT_TRUE(state.ok());
    const auto parts = prefill_shipping_rows(*sender, tokens, 300);
    ASSERT_FALSE(HasFailure());
    // Two sparse layers' first parts past position 64: the region's end, then a bitmap of
    // its references (the parts before them: the sinks, shipped while a later layer had
    // still to choose the tokens kept exact).
    std::map<int32_t, std::vector<const RowsPart*>> by_layer;  // each layer's parts, in order
    std::vector<int32_t> order;
    for (const auto& p : parts) {
        if ((*state)[7 * sizeof(int32_t) + p.layer] != 0) continue;  // a full layer
        if (by_layer[p.layer].empty()) order.push_back(p.layer);
        by_layer[p.layer].push_back(&p);
    }
    ASSERT_GE(order.size(), 2u) << "fewer than two sparse layers at keep 0.3";
    std::vector<const RowsPart*> sparse;
    std::vector<std::vector<const RowsPart*>> lead(2);
    for (int i = 0; i < 2; ++i) {
        for (const RowsPart* p : by_layer[order[i]]) {
            if (p->end > 64) {
                sparse.push_back(p);
                break;
            }
            lead[i].push_back(p);
        }
    }
    ASSERT_EQ(sparse.size(), 2u);

    auto receiver = context("deltakv_exact");
    ASSERT_TRUE(receiver->import_kv_state(*state).ok());
    for (int i = 0; i < 2; ++i) {
        for (const RowsPart* p : lead[i])
            ASSERT_TRUE(receiver->import_kv_rows(p->layer, p->begin, p->end, p->bytes).ok());
    }
    const RowsPart& a = *sparse[0];
    const RowsPart& b = *sparse[1];
    ASSERT_TRUE(receiver->import_kv_rows(a.layer, a.begin, a.end, a.bytes).ok());
    // The second layer calls a token a reference that the first compressed (its first byte
    // of the bitmap, inverted, changes which rows follow: refused either way).
    auto flipped = b.bytes;
    flipped[sizeof(int32_t)] ^= 0xff;
    EXPECT_EQ(receiver->import_kv_rows(b.layer, b.begin, b.end, flipped).code(),
              StatusCode::kDataLoss);
    // A region that ends elsewhere than the first layer's.
    auto moved = b.bytes;
    const int32_t region = 16;
    std::memcpy(moved.data(), &region, sizeof(region));
    EXPECT_EQ(receiver->import_kv_rows(b.layer, b.begin, b.end, moved).code(),
              StatusCode::kDataLoss);
    std::vector<uint8_t> cut(b.bytes.begin(), b.bytes.end() - 1);
    EXPECT_EQ(receiver->import_kv_rows(b.layer, b.begin, b.end, cut).code(), StatusCode::kDataLoss);
    EXPECT_EQ(receiver->import_kv_rows(b.layer, b.begin, 901, b.bytes).code(),
              StatusCode::kInvalidArgument);
    // The genuine part still fits after the refusals.
    EXPECT_TRUE(receiver->import_kv_rows(b.layer, b.begin, b.end, b.bytes).ok());
}

TEST_P(KvShippingTest, BadPartsAreRefusedWithClearErrors) {
    auto sender = context(GetParam());
    ASSERT_TRUE(sender);
    const auto tokens = text_tokens(700);
    ASSERT_TRUE(sender->eval(tokens).ok());
    auto state = sender->export_kv_state();
    auto layer = sender->export_kv_layer(1);
    ASSERT_TRUE(state.ok() && layer.ok());

    auto receiver = context(GetParam());
    std::vector<uint8_t> cut(state->begin(), state->end() - 1);
    EXPECT_EQ(receiver->import_kv_state(cut).code(), StatusCode::kDataLoss);
    ASSERT_TRUE(receiver->import_kv_state(*state).ok());
    std::vector<uint8_t> short_layer(layer->begin(), layer->end() - 4);
    EXPECT_EQ(receiver->import_kv_layer(1, short_layer).code(), StatusCode::kDataLoss);
    EXPECT_EQ(receiver->import_kv_layer(n_layers(), *layer).code(), StatusCode::kInvalidArgument);
    // A second import into a context that holds tokens.
    EXPECT_EQ(receiver->import_kv_state(*state).code(), StatusCode::kFailedPrecondition);

    // Another policy's state does not fit.
    auto other = context(std::string(GetParam()) == "full" ? "deltakv" : "full");
    ASSERT_TRUE(other);
    EXPECT_FALSE(other->import_kv_state(*state).ok());
}

TEST_F(KvShipping, DeltaKvRefusesLatentsPointingAtCompressedTokens) {
    auto sender = context("deltakv");
    ASSERT_TRUE(sender);
    const auto tokens = text_tokens(1000);
    ASSERT_TRUE(sender->eval(tokens).ok());
    auto state = sender->export_kv_state();
    ASSERT_TRUE(state.ok());
    // A sparse layer (the state's layer roles follow its seven 32-bit fields, then a bitmap
    // of the region's references); its part ends with the latents' reference positions and
    // a byte per latent: point the last reference past the sequence.
    int32_t sparse = -1;
    for (int32_t l = n_layers() - 1; l > 0 && sparse < 0; --l) {
        if ((*state)[7 * sizeof(int32_t) + l] == 0) sparse = l;
    }
    ASSERT_GE(sparse, 0) << "no sparse layer at keep 0.3";
    int32_t region_end = 0, sinks = 0;
    std::memcpy(&region_end, state->data() + 4, 4);
    std::memcpy(&sinks, state->data() + 8, 4);
    size_t latents = static_cast<size_t>(region_end - sinks);
    for (size_t i = 7 * sizeof(int32_t) + n_layers(); i < state->size(); ++i)
        latents -= static_cast<size_t>(__builtin_popcount((*state)[i]));
    ASSERT_GT(latents, 0u);
    auto part = sender->export_kv_layer(sparse);
    ASSERT_TRUE(part.ok());
    const uint16_t bad = 60000;
    std::memcpy(part->data() + part->size() - latents - sizeof(bad), &bad, sizeof(bad));
    auto receiver = context("deltakv");
    ASSERT_TRUE(receiver->import_kv_state(*state).ok());
    EXPECT_EQ(receiver->import_kv_layer(sparse, *part).code(), StatusCode::kDataLoss);
}

TEST_F(KvShipping, PoliciesThatCannotShipSaySo) {
    auto c = context("snapkv");
    ASSERT_TRUE(c);
    ASSERT_TRUE(c->eval(text_tokens(64)).ok());
    EXPECT_EQ(c->export_kv_state().error().code(), StatusCode::kUnimplemented);
}

INSTANTIATE_TEST_SUITE_P(Policies, KvShippingTest,
                         ::testing::Values("full", "deltakv", "deltakv_exact"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace deltaserve::model
