// DeltaKvSequenceCache over a model that mixes sliding-window layers with global ones (as
// Gemma 3 does): the window layers keep their window exact and give the rest back, the
// global layers compress exactly as a model of only those layers would, and a session ships,
// restores and is read by the tools with its window layers' rows.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>

#include "deltaserve/common/fp16.h"
#include "deltaserve/kvstore/deltakv_cache.h"
#include "deltaserve/kvstore/kv_layer_groups.h"
#include "deltaserve/kvstore/kv_rows_info.h"

namespace deltaserve::kvstore {
namespace {

namespace k = deltaserve::kernels;

constexpr int kKvHeads = 2, kHeadDim = 8, kKvDim = kKvHeads * kHeadDim, kD = 2 * kKvDim;
constexpr int kHeads = 4, kM = 8, kHidden = 12, kWindow = 24;
const k::AttentionShape kShape{kHeads, kKvHeads, kHeadDim, 1.0f / std::sqrt(float(kHeadDim))};
// Six layers: 0, 1 and 3 attend a window; 2 is the full global layer, 4 and 5 sparse.
const std::vector<uint8_t> kWindowLayer = {1, 1, 0, 1, 0, 0};
const std::vector<int32_t> kGlobal = {2, 4, 5};

// Compressors for `layers` of n_layers (the others have none, as calibration leaves a window
// layer), the same weights for the same index into `layers`.
DeltaKvProfile profile(int32_t n_layers, const std::vector<int32_t>& layers) {
    DeltaKvProfile p;
    p.d = kD;
    p.m = kM;
    p.k = 2;
    p.stride = 5;
    p.sinks = 4;
    p.layers.resize(static_cast<size_t>(n_layers));
    p.storage.reserve(layers.size() * 4);
    for (size_t i = 0; i < layers.size(); ++i) {
        std::mt19937 rng(static_cast<uint32_t>(7 + i));
        std::normal_distribution<float> nd(0.0f, 0.3f);
        auto add = [&](int64_t rows, int64_t cols) {
            p.storage.emplace_back(static_cast<size_t>(rows * cols));
            for (auto& x : p.storage.back()) x = nd(rng);
            return k::WeightMatrix{k::DType::kF32, rows, cols, p.storage.back().data()};
        };
        k::DeltaKvLayer& w = p.layers[layers[i]];
        w.w1 = add(kHidden, kD);
        w.w2 = add(kHidden, kD);
        w.w3 = add(kM, kHidden);
        w.wd = add(kD, kM);
    }
    prepare_int4_decoders(p);
    return p;
}

DeltaKvOptions windowed() {
    DeltaKvOptions o;
    o.n_layers = 6;
    o.n_kv_heads = kKvHeads;
    o.head_dim = kHeadDim;
    o.full_layer = {0, 0, 1, 0, 0, 0};
    o.window_layer = kWindowLayer;
    o.sliding_window = kWindow;
    o.sinks = 4;
    o.stride = 5;
    o.k = 2;
    o.window = 8;
    o.n_ctx = 512;
    o.n_batch = 20;
    o.pin_ratio = 0.0f;
    return o;
}

// The same model's global layers alone: layers 2, 4, 5 as 0, 1, 2.
DeltaKvOptions global_only() {
    DeltaKvOptions o = windowed();
    o.n_layers = 3;
    o.full_layer = {1, 0, 0};
    o.window_layer.clear();
    o.sliding_window = 0;
    return o;
}

// Random rows per (position, layer): K after RoPE and V, as the forward pass stores them.
struct Rows {
    std::mt19937 rng{3};
    std::normal_distribution<float> nd{0.0f, 1.0f};
    std::vector<std::vector<float>> kv;  // [pos] -> [layer][D]

    const float* at(int32_t pos, int32_t layer) const { return kv[pos].data() + layer * kD; }
    void grow(int32_t n, int32_t n_layers) {
        while (static_cast<int32_t>(kv.size()) < n) {
            kv.emplace_back(static_cast<size_t>(n_layers) * kD);
            for (auto& v : kv.back()) v = nd(rng);
        }
    }
};

// One forward call of n tokens over `layers` of c (model layer l stored from rows' layer
// from[l]); every layer sees the same queries.
void chunk(DeltaKvSequenceCache& c, Rows& rows, int32_t n, const std::vector<int32_t>& from,
           ThreadPool& threads) {
    const int32_t p0 = c.n_tokens();
    rows.grow(p0 + n, 6);
    ASSERT_TRUE(c.reserve(n).ok());
    std::vector<float> q(static_cast<size_t>(n) * kHeads * kHeadDim, 0.5f);
    std::vector<float> kk(static_cast<size_t>(n) * kKvDim), vv(kk.size());
    for (size_t l = 0; l < from.size(); ++l) {
        for (int32_t i = 0; i < n; ++i) {
            const float* x = rows.at(p0 + i, from[l]);
            std::copy_n(x, kKvDim, kk.data() + i * kKvDim);
            std::copy_n(x + kKvDim, kKvDim, vv.data() + i * kKvDim);
        }
        const auto layer = static_cast<int32_t>(l);
        ASSERT_TRUE(c.store(layer, 0, n, kk.data(), vv.data(), kKvDim).ok());
        std::vector<float> out(q.size());
        ASSERT_TRUE(c.attend(layer, kShape, q.data(), kHeads * kHeadDim, n, out.data(),
                             kHeads * kHeadDim, threads)
                        .ok());
        ASSERT_TRUE(
            c.observe(layer, kShape, q.data(), kHeads * kHeadDim, nullptr, 0, n, threads).ok());
    }
    ASSERT_TRUE(c.commit(n).ok());
}

const std::vector<int32_t> kAll = {0, 1, 2, 3, 4, 5};

// The fp16 K row of a view's entry i, as floats.
std::vector<float> view_k(const k::KvView& v, int32_t i) {
    std::vector<float> out(kKvDim);
    const auto* h = reinterpret_cast<const uint16_t*>(v.k + v.slots[i] * v.row_stride);
    for (int t = 0; t < kKvDim; ++t) out[t] = fp16_to_fp32(h[t]);
    return out;
}

TEST(DeltaKvWindow, WindowLayersHoldTheirWindowAndGlobalLayersCompressAsAlone) {
    ThreadPool threads(2);
    const DeltaKvProfile p6 = profile(6, kGlobal), p3 = profile(3, {0, 1, 2});
    auto c = DeltaKvSequenceCache::create(p6, windowed(), threads);
    auto g = DeltaKvSequenceCache::create(p3, global_only(), threads);
    ASSERT_TRUE(c.ok()) << c.error().to_string();
    ASSERT_TRUE(g.ok()) << g.error().to_string();
    Rows rows;
    const size_t row = 2 * 2 * kKvDim;  // fp16 K and V
    for (int32_t n = 0; n < 300; n += 20) {
        chunk(**c, rows, 20, kAll, threads);
        chunk(**g, rows, 20, kGlobal, threads);
        if (HasFatalFailure()) return;
        // This call's first query (at n) needs the window ending there, and the slack before.
        const int32_t first = std::max(0, n - kWindow + 1 - kWindowSlack);
        ASSERT_EQ((*c)->window_first(), first) << "after " << n + 20;
        // The global layers are the 3-layer model's: the same compression, the same bytes.
        EXPECT_EQ((*c)->compressed_tokens(), (*g)->compressed_tokens());
        for (int32_t i = 0; i < 3; ++i) {
            EXPECT_EQ((*c)->view_positions(kGlobal[i], 0), (*g)->view_positions(i, 0));
        }
        const size_t window_rows = static_cast<size_t>(n + 20 - first) * 3;
        EXPECT_EQ((*c)->bytes(), (*g)->bytes() + window_rows * row);
        EXPECT_LE((*c)->bytes(), (*c)->bytes_bound(n + 20));
    }
    EXPECT_GT((*c)->compressed_tokens(), 150);
    // A window layer's view: the rows held, in order, each query limited to its window.
    for (int32_t l : {0, 1, 3}) {
        const k::KvView v = (*c)->view(l, 0);
        EXPECT_EQ(v.window, kWindow);
        ASSERT_EQ(v.n, 300 - (*c)->window_first());
        for (int32_t i = 0; i < v.n; i += 7) {
            const std::vector<float> got = view_k(v, i);
            const float* want = rows.at((*c)->window_first() + i, l);
            for (int t = 0; t < kKvDim; ++t)
                ASSERT_EQ(got[t], fp16_to_fp32(fp32_to_fp16(want[t]))) << l << " " << i;
        }
    }
    // Memory: the window layers' pool holds the window, the slack and a chunk, not 300 rows.
    const size_t window_pool = (*c)->resident_bytes() - (*g)->resident_bytes();
    EXPECT_LT(window_pool, 3 * row * 300 / 2);
}

// A windowed cache holding n tokens, fed 20 at a time.
std::unique_ptr<DeltaKvSequenceCache> session(const DeltaKvProfile& p, Rows& rows, int32_t n,
                                              ThreadPool& threads) {
    auto c = DeltaKvSequenceCache::create(p, windowed(), threads);
    EXPECT_TRUE(c.ok()) << c.error().to_string();
    if (!c.ok()) return nullptr;
    for (int32_t at = 0; at < n; at += 20) chunk(**c, rows, 20, kAll, threads);
    return std::move(*c);
}

TEST(DeltaKvWindow, ACutInsideTheSlackKeepsTheSessionOneBeforeItKeepsNothing) {
    ThreadPool threads(2);
    const DeltaKvProfile p6 = profile(6, kGlobal);
    Rows rows;
    auto c = session(p6, rows, 300, threads);
    ASSERT_TRUE(c);
    const int32_t first = c->window_first();  // 280 - 23 - 64
    EXPECT_EQ(c->kept_by_truncate(first + kWindow - 1), first + kWindow - 1);
    EXPECT_EQ(c->kept_by_truncate(first + kWindow - 2), 0);
    c->truncate(first + kWindow + 10);
    EXPECT_EQ(c->n_tokens(), first + kWindow + 10);
    chunk(*c, rows, 20, kAll, threads);  // and it goes on from there
    EXPECT_EQ(c->n_tokens(), first + kWindow + 30);
    c->truncate(first);
    EXPECT_EQ(c->n_tokens(), 0) << "the window of the next query is gone: nothing kept";
    EXPECT_EQ(c->window_first(), 0);
}

// Every layer's part the same, a window layer's from the later of the two caches' first rows
// (a cache gives rows back at its next call; an import takes only what the window needs).
void expect_same_parts(DeltaKvSequenceCache& a, DeltaKvSequenceCache& b) {
    ASSERT_EQ(a.n_tokens(), b.n_tokens());
    const int32_t from = std::max(a.window_first(), b.window_first());
    for (int32_t l = 0; l < 6; ++l) {
        const auto part = [&](DeltaKvSequenceCache& c) {
            return kWindowLayer[l] ? c.codec()->export_rows(l, from, c.n_tokens())
                                   : c.codec()->export_layer(l);
        };
        auto x = part(a);
        auto y = part(b);
        ASSERT_TRUE(x.ok() && y.ok());
        EXPECT_EQ(*x, *y) << "layer " << l;
    }
}

TEST(DeltaKvWindow, ASessionShipsWholeAndAsRowsWithItsWindows) {
    ThreadPool threads(2);
    const DeltaKvProfile p6 = profile(6, kGlobal);
    Rows rows;
    auto c = session(p6, rows, 200, threads);
    ASSERT_TRUE(c);
    auto state = c->codec()->export_state();
    ASSERT_TRUE(state.ok());
    // Whole.
    auto whole = DeltaKvSequenceCache::create(p6, windowed(), threads);
    ASSERT_TRUE(whole.ok());
    ASSERT_TRUE((*whole)->codec()->import_state(*state).ok());
    for (int32_t l = 0; l < 6; ++l) {
        auto part = c->codec()->export_layer(l);
        ASSERT_TRUE(part.ok());
        ASSERT_TRUE((*whole)->codec()->import_layer(l, *part).ok()) << l;
    }
    EXPECT_EQ((*whole)->window_first(), std::max(0, 200 - kWindow + 1 - kWindowSlack));
    expect_same_parts(*c, **whole);
    // As rows, in two ranges a layer, read by the tools without a cache.
    auto rows_state = c->codec()->export_rows_state(200);
    ASSERT_TRUE(rows_state.ok());
    auto by_rows = DeltaKvSequenceCache::create(p6, windowed(), threads);
    ASSERT_TRUE(by_rows.ok());
    ASSERT_TRUE((*by_rows)->codec()->import_state(*rows_state).ok());
    for (int32_t l = 0; l < 6; ++l) {
        for (const auto [b, e] : {std::pair{0, 96}, std::pair{96, 200}}) {
            auto part = c->codec()->export_rows(l, b, e);
            ASSERT_TRUE(part.ok()) << part.error().to_string();
            ASSERT_TRUE((*by_rows)->codec()->import_rows(l, b, e, *part).ok()) << l << " " << b;
            auto info = kv_rows_info(KvCodecId::kDeltaKv, *rows_state, l, b, e, *part, true);
            ASSERT_TRUE(info.ok()) << info.error().to_string();
            const int32_t dropped =
                kWindowLayer[l] ? std::clamp(c->window_first() - b, 0, e - b) : 0;
            EXPECT_EQ(info->dropped, dropped) << l << " " << b;
            EXPECT_EQ(info->kinds.size(), static_cast<size_t>(e - b));
        }
    }
    expect_same_parts(*c, **by_rows);
    // Both go on as the original does.
    Rows again = rows;
    chunk(*c, rows, 20, kAll, threads);
    chunk(**whole, again, 20, kAll, threads);
    expect_same_parts(*c, **whole);
}

TEST(DeltaKvWindow, PartsWithoutTheRowsTheWindowNeedsAreRefused) {
    ThreadPool threads(2);
    const DeltaKvProfile p6 = profile(6, kGlobal);
    Rows rows;
    auto c = session(p6, rows, 200, threads);
    ASSERT_TRUE(c);
    auto state = c->codec()->export_state();
    auto part = c->codec()->export_layer(0);
    ASSERT_TRUE(state.ok() && part.ok());
    auto d = DeltaKvSequenceCache::create(p6, windowed(), threads);
    ASSERT_TRUE(d.ok());
    ASSERT_TRUE((*d)->codec()->import_state(*state).ok());
    // A part that starts after the first row the window needs: K and V rows from there.
    int32_t first = 0;
    std::memcpy(&first, part->data(), 4);
    const int32_t late_first = (*d)->window_first() + 1;
    const size_t row = 2 * kKvDim, skip = static_cast<size_t>(late_first - first),
                 n = static_cast<size_t>(200 - first);
    ASSERT_GT(late_first, first);
    std::vector<uint8_t> late(4);
    std::memcpy(late.data(), &late_first, 4);
    const uint8_t* k_rows = part->data() + 4;
    late.insert(late.end(), k_rows + skip * row, k_rows + n * row);
    late.insert(late.end(), k_rows + (n + skip) * row, k_rows + 2 * n * row);
    auto st = (*d)->codec()->import_layer(0, late);
    EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.to_string();
    EXPECT_NE(st.message().find("the window needs them from"), std::string::npos);
    std::vector<uint8_t> cut(part->begin(), part->end() - 1);
    EXPECT_EQ((*d)->codec()->import_layer(0, cut).code(), StatusCode::kDataLoss);
    EXPECT_EQ((*d)->codec()->import_layer(0, std::span<const uint8_t>(part->data(), 2)).code(),
              StatusCode::kDataLoss);
    EXPECT_TRUE((*d)->codec()->import_layer(0, *part).ok()) << "the real one still fits";
    // A state of another window, or of a model without window layers, is refused.
    DeltaKvOptions other = windowed();
    other.sliding_window = kWindow + 1;
    auto e = DeltaKvSequenceCache::create(p6, other, threads);
    ASSERT_TRUE(e.ok());
    EXPECT_EQ((*e)->codec()->import_state(*state).code(), StatusCode::kFailedPrecondition);
    DeltaKvOptions none = windowed();
    none.window_layer.clear();
    none.sliding_window = 0;
    const DeltaKvProfile all = profile(6, kAll);
    auto f = DeltaKvSequenceCache::create(all, none, threads);
    ASSERT_TRUE(f.ok());
    EXPECT_EQ((*f)->codec()->import_state(*state).code(), StatusCode::kFailedPrecondition);
    // The tools refuse a part whose state is cut in its window field.
    auto rs = c->codec()->export_rows_state(200);
    ASSERT_TRUE(rs.ok());
    const std::vector<uint8_t> short_state(rs->begin(), rs->end() - 2);
    EXPECT_FALSE(kv_rows_info(KvCodecId::kDeltaKv, short_state, 0, 0, 200, *part).ok());
}

TEST(DeltaKvWindow, OptionsAndProfilesThatDoNotFitAreRefused) {
    ThreadPool threads(2);
    const DeltaKvProfile p6 = profile(6, kGlobal);
    DeltaKvOptions o = windowed();
    o.full_layer = {1, 0, 0, 0, 0, 0};  // a window layer cannot be the full one
    auto a = DeltaKvSequenceCache::create(p6, o, threads);
    ASSERT_FALSE(a.ok());
    EXPECT_NE(a.error().message().find("layer 0 is a window layer"), std::string::npos);
    o = windowed();
    o.sliding_window = 0;
    EXPECT_FALSE(DeltaKvSequenceCache::create(p6, o, threads).ok());
    // Without window layers, layers 0, 1 and 3 would be compressed: they have no compressor.
    o = windowed();
    o.window_layer.clear();
    auto b = DeltaKvSequenceCache::create(p6, o, threads);
    ASSERT_FALSE(b.ok());
    EXPECT_NE(b.error().message().find("no compressor for layer 0"), std::string::npos);
    // Full layers for a keep target are taken among the global layers only.
    DeltaKvProfile ordered = profile(6, kGlobal);
    ordered.sensitivity_order = {0, 1, 4, 2, 3, 5};
    const DeltaKvOptions kept = deltakv_options_for_keep(ordered, 0.9f, windowed());
    EXPECT_EQ(kept.full_layer, (std::vector<uint8_t>{0, 0, 1, 0, 1, 0}));
    EXPECT_TRUE(DeltaKvSequenceCache::create(ordered, kept, threads).ok());
}

}  // namespace
}  // namespace deltaserve::kvstore
