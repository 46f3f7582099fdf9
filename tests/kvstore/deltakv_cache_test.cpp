// DeltaKvSequenceCache driven as the forward pass drives it, with a synthetic profile whose
// decoder is zero: a reconstructed token is then exactly the mean of its k nearest
// references (by L2 on pre-RoPE [K; V], among references at or before it), re-RoPEd at its
// position, which the test computes on its own, and a decode step's attention over it. Also:
// what gets compressed when, the view a decode step sees, the bytes held, truncation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>

#include <unistd.h>

#include "deltaserve/common/fp16.h"
#include "deltaserve/kvstore/deltakv_cache.h"

namespace deltaserve::kvstore {
namespace {

namespace k = deltaserve::kernels;

constexpr int kLayers = 3, kKvHeads = 2, kHeadDim = 8, kKvDim = kKvHeads * kHeadDim,
              kD = 2 * kKvDim;
constexpr int kHeads = 4, kM = 8, kHidden = 12;
const k::AttentionShape kShape{kHeads, kKvHeads, kHeadDim, 1.0f / std::sqrt(float(kHeadDim))};

DeltaKvProfile zero_decoder_profile(std::mt19937& rng) {
    DeltaKvProfile p;
    p.d = kD;
    p.m = kM;
    p.k = 2;
    p.stride = 5;
    p.sinks = 4;
    std::normal_distribution<float> nd(0.0f, 0.3f);
    p.storage.reserve(kLayers * 4);
    for (int l = 0; l < kLayers; ++l) {
        auto add = [&](int64_t rows, int64_t cols, bool zero) {
            p.storage.emplace_back(static_cast<size_t>(rows * cols));
            for (auto& x : p.storage.back()) x = zero ? 0.0f : nd(rng);
            return k::WeightMatrix{k::DType::kF32, rows, cols, p.storage.back().data()};
        };
        k::DeltaKvLayer w;
        w.w1 = add(kHidden, kD, false);
        w.w2 = add(kHidden, kD, false);
        w.w3 = add(kM, kHidden, false);
        w.wd = add(kD, kM, true);
        p.layers.push_back(w);
    }
    p.sensitivity_order = {0, 1, 2};
    prepare_int4_decoders(p);
    return p;
}

DeltaKvOptions options() {
    DeltaKvOptions o;
    o.n_layers = kLayers;
    o.n_kv_heads = kKvHeads;
    o.head_dim = kHeadDim;
    o.full_layer = {1, 0, 0};
    o.sinks = 4;
    o.stride = 5;
    o.k = 2;
    o.window = 8;
    o.select_ratio = 0.5f;
    o.n_ctx = 128;
    return o;
}

// Pre-RoPE K and V of every (position, layer), and what the cache was given (K after RoPE).
struct Data {
    std::mt19937 rng{17};
    std::normal_distribution<float> nd{0.0f, 1.0f};
    std::vector<std::vector<float>> x;  // [pos] -> [layer][D] pre-RoPE [K; V]

    std::vector<float> q;  // the last chunk's queries (all layers share them here)
    bool same_layers =
        false;  // layer 2 gets layer 1's K and V (and compressors: after_first_chunk)
    std::vector<int32_t> loud;  // positions whose keys are 4x as long (in every layer)

    void chunk(DeltaKvSequenceCache& c, int32_t n, ThreadPool& threads) {
        ASSERT_TRUE(c.reserve(n).ok());
        const int32_t p0 = c.n_tokens();
        for (int32_t i = 0; i < n; ++i) {
            if (static_cast<int32_t>(x.size()) > p0 + i) continue;  // given beforehand
            x.emplace_back(kLayers * kD);
            for (auto& v : x.back()) v = nd(rng);
            if (std::find(loud.begin(), loud.end(), p0 + i) != loud.end()) {
                for (int32_t l = 0; l < kLayers; ++l)
                    std::for_each_n(x.back().begin() + l * kD, kKvDim, [](float& v) { v *= 4.0f; });
            }
            if (same_layers) std::copy_n(x.back().begin() + kD, kD, x.back().begin() + 2 * kD);
        }
        q.resize(static_cast<size_t>(n) * kHeads * kHeadDim);
        for (auto& v : q) v = nd(rng);
        std::vector<float> kk(static_cast<size_t>(n) * kKvDim), vv(kk.size());
        for (int32_t l = 0; l < kLayers; ++l) {
            for (int32_t i = 0; i < n; ++i) {
                const float* xi = x[p0 + i].data() + l * kD;
                std::copy_n(xi, kKvDim, kk.data() + i * kKvDim);
                std::copy_n(xi + kKvDim, kKvDim, vv.data() + i * kKvDim);
                k::rope(kk.data() + i * kKvDim, kKvHeads, kHeadDim, p0 + i, 10000.0f,
                        k::RopeStyle::kInterleaved);
            }
            EXPECT_TRUE(c.store(l, 0, n, kk.data(), vv.data(), kKvDim).ok());
            const k::KvView v = c.view(l, n);
            // Every new token is visible, in position order, after what came before.
            ASSERT_GE(v.n, n);
            if (c.compressed_tokens() == 0) {
                ASSERT_EQ(v.n, p0 + n) << "nothing compressed yet: every token";
            }
            EXPECT_TRUE(
                c.observe(l, kShape, q.data(), kHeads * kHeadDim, nullptr, 0, n, threads).ok());
        }
        EXPECT_TRUE(c.commit(n).ok());
    }
    // x as the cache sees it: K rounded to fp16 after RoPE, then de-RoPEd; V rounded.
    std::vector<float> cached_x(int32_t pos, int32_t layer) const {
        std::vector<float> v(x[pos].begin() + layer * kD, x[pos].begin() + (layer + 1) * kD);
        k::rope(v.data(), kKvHeads, kHeadDim, pos, 10000.0f, k::RopeStyle::kInterleaved);
        for (auto& t : v) t = fp16_to_fp32(fp32_to_fp16(t));
        k::rope_inverse(v.data(), kKvHeads, kHeadDim, pos, 10000.0f, k::RopeStyle::kInterleaved);
        return v;
    }
};

TEST(DeltaKvCache, CompressesTheOldestWindowWhenTheBufferDoubles) {
    std::mt19937 rng(1);
    const DeltaKvProfile p = zero_decoder_profile(rng);
    ThreadPool threads(2);
    auto c = DeltaKvSequenceCache::create(p, options(), threads);
    ASSERT_TRUE(c.ok()) << c.error().to_string();
    Data data;
    data.chunk(**c, 15, threads);
    EXPECT_EQ((*c)->compressed_tokens(), 0) << "buffer of 11 < 2 x 8";
    data.chunk(**c, 25, threads);  // 40 tokens: region grows to [4, 28), buffer [28, 40)
    // References in [4, 28): 4, 9, 14, 19, 24; the other 19 are latents.
    EXPECT_EQ((*c)->compressed_tokens(), 19);
    const size_t row = kKvDim * 2 * 2;
    const size_t want = 40 * 1 * row              // the full layer
                        + (4 + 5 + 12) * 2 * row  // sinks, references, buffer in 2 sparse layers
                        + 19 * 2 * (k::int4_bytes(kM) + 4 + 1)  // latents, 2 ref ids, codes
                        + 40 * 13                               // position maps, reference flags
                        + 5 * 4;                                // the references' positions
    EXPECT_EQ((*c)->bytes(), want);
    EXPECT_LT((*c)->bytes(), full_fp16_bytes(40, kLayers, kKvDim));
}

TEST(DeltaKvCache, AKeepTargetFillsTheRoomWithRecentTokensAndIsNeverExceeded) {
    // Also with half of what compression takes kept exact (those tokens save nothing), under
    // a target that leaves it room.
    for (const auto [share, keep] : {std::pair{0.0f, 0.8}, std::pair{0.5f, 0.95}}) {
        SCOPED_TRACE("exact share " + std::to_string(share));
        std::mt19937 rng(1);
        const DeltaKvProfile p = zero_decoder_profile(rng);
        ThreadPool threads(2);
        DeltaKvOptions fixed = options(), target = options();
        fixed.n_ctx = target.n_ctx = 512;
        fixed.exact_share = target.exact_share = share;
        target.keep = static_cast<float>(keep);
        auto a = DeltaKvSequenceCache::create(p, fixed, threads);
        auto b = DeltaKvSequenceCache::create(p, target, threads);
        ASSERT_TRUE(a.ok() && b.ok());
        Data da, db;
        double ratio_a = 0, ratio_b = 0;
        // One token at a time, or chunks that compress several blocks at once.
        const int32_t step = share > 0.0f ? 25 : 1;
        for (int32_t n = 0; n < 400; n += step) {
            da.chunk(**a, step, threads);
            db.chunk(**b, step, threads);
            if (HasFatalFailure()) return;
            const double full = static_cast<double>(full_fp16_bytes(n + step, kLayers, kKvDim));
            ratio_a = (*a)->bytes() / full;
            ratio_b = (*b)->bytes() / full;
            // Never above the target, unless the fixed stride alone is (short sequences).
            ASSERT_LE(ratio_b, std::max(keep, ratio_a) + 1e-6) << "after " << n + step << " tokens";
        }
        // The fixed stride alone leaves room at this length; the target fills it with a
        // longer buffer (the same references, fewer tokens compressed).
        std::printf("keep ratio at 400 tokens: %.3f fixed stride, %.3f with the target %.2f\n",
                    ratio_a, ratio_b, keep);
        EXPECT_LT(ratio_a, keep - 0.05);
        EXPECT_GT(ratio_b, keep - 0.02);
        EXPECT_LT((*b)->compressed_tokens(), (*a)->compressed_tokens());
    }
}

// With the profile's key errors, a reconstructed token's logit gets s^2 sum_t q_t^2 var_t / 2
// (interleaved RoPE: dimensions 2j and 2j + 1 share pair j's variance).
float logit_correction(const DeltaKvProfile& p, int32_t layer, const float* q, int h) {
    if (p.key_error_var.empty()) return 0.0f;
    const float* var = p.key_error_var[layer].data() + (h / (kHeads / kKvHeads)) * (kHeadDim / 2);
    double b = 0;
    for (int t = 0; t < kHeadDim; ++t)
        b += double(q[h * kHeadDim + t]) * q[h * kHeadDim + t] * var[t / 2];
    return static_cast<float>(0.5 * kShape.scale * kShape.scale * b);
}

void set_key_errors(DeltaKvProfile& p) {
    p.key_error_var.assign(kLayers, {});
    for (int l = 1; l < kLayers; ++l) {
        for (int i = 0; i < kKvHeads * kHeadDim / 2; ++i)
            p.key_error_var[l].push_back(0.5f + 0.25f * (i % 5) + l);
    }
}

TEST(DeltaKvCache, DecodeStepAttendsSelectedTokensReconstructedFromTheirNearestReferences) {
    for (int run = 0; run < 5; ++run) {
        // int4 latents (integer decoder) and fp16 latents (matmul); then int4 with the logit
        // correction for the profile's key errors; then int4 with a share kept exact, judged
        // by both sparse layers, then by the first alone.
        const int bits = run == 1 ? 16 : 4;
        SCOPED_TRACE("latent bits " + std::to_string(bits) +
                     (run == 2 ? ", logits corrected" : "") +
                     (run == 3 ? ", the worst reconstructed kept exact" : "") +
                     (run == 4 ? ", the worst reconstructed in layer 1 kept exact" : ""));
        std::mt19937 rng(1);
        DeltaKvProfile p = zero_decoder_profile(rng);
        if (run == 2) set_key_errors(p);
        ThreadPool threads(2);
        DeltaKvOptions o = options();
        o.latent_bits = bits;
        Data data;
        // 10% of the 19 tokens compressed: one stays exact, the one whose keys (4x as long as
        // the others') the mean of its references misses most. It becomes a reference, so the
        // references after it (19, 24) move up an ordinal in the latents naming them. Judged
        // by layer 1 alone, layer 2 compresses after the choice: its latents may name it.
        int32_t kept = -1;
        if (run >= 3) {
            o.exact_share = 0.1f;
            o.exact_depth = run == 4 ? 0.5f : 1.0f;
            kept = 17;
            data.loud = {kept};
        }
        auto exact = [&](int32_t t) { return (t - 4) % 5 == 0 || t == kept; };
        auto made = DeltaKvSequenceCache::create(p, o, threads);
        ASSERT_TRUE(made.ok());
        DeltaKvSequenceCache& c = **made;
        data.chunk(c, 40, threads);
        ASSERT_EQ(c.compressed_tokens(), run >= 3 ? 18 : 19);

        // One decode step at position 40, checked layer by layer from inside.
        ASSERT_TRUE(c.reserve(1).ok());
        data.x.emplace_back(kLayers * kD);
        for (auto& v : data.x.back()) v = data.nd(data.rng);
        std::vector<float> q(kHeads * kHeadDim);
        for (auto& v : q) v = data.nd(data.rng);
        // The observation layer's choice: score = max over heads of q . k (after RoPE, fp16).
        std::vector<std::pair<float, int32_t>> score;
        for (int32_t t = 4; t < 28; ++t) {
            std::vector<float> kt(data.x[t].begin(), data.x[t].begin() + kKvDim);
            k::rope(kt.data(), kKvHeads, kHeadDim, t, 10000.0f, k::RopeStyle::kInterleaved);
            float best = -INFINITY;
            for (int h = 0; h < kHeads; ++h) {
                float s = 0;
                for (int d = 0; d < kHeadDim; ++d) {
                    s += q[h * kHeadDim + d] *
                         fp16_to_fp32(fp32_to_fp16(kt[(h / 2) * kHeadDim + d]));
                }
                best = std::max(best, s);
            }
            score.emplace_back(-best, t);
        }
        std::sort(score.begin(), score.end());
        std::vector<int32_t> chosen;
        for (int i = 0; i < 12; ++i) chosen.push_back(score[i].second);  // ceil(0.5 x 24)
        std::sort(chosen.begin(), chosen.end());
        if (run >= 3) {
            ASSERT_TRUE(std::binary_search(chosen.begin(), chosen.end(), kept))
                << "the step attends it";
        }

        // What a decode step at position 40 attends to in a sparse layer: the sinks, the chosen
        // tokens (a reference as itself, a latent one as the mean of its 2 nearest references,
        // the decoder being zero), the buffer [28, 40) and the new token; K after RoPE.
        auto expected_rows = [&](int32_t l) {
            std::vector<std::vector<float>> rows;
            auto add = [&](int32_t t, std::vector<float> x) {
                k::rope(x.data(), kKvHeads, kHeadDim, t, 10000.0f, k::RopeStyle::kInterleaved);
                rows.push_back(std::move(x));
            };
            for (int32_t t = 0; t < 4; ++t) add(t, data.cached_x(t, l));
            for (int32_t t : chosen) {
                if (exact(t)) {
                    add(t, data.cached_x(t, l));
                    continue;
                }
                std::vector<std::pair<float, int32_t>> dist;
                const auto xt = data.cached_x(t, l);
                // Among the strided references: the kept token became one after they chose
                // (but before layer 2 chose, when layer 1 alone judged).
                for (int32_t r = 0; r <= t; ++r) {
                    if (r >= 4 && (r - 4) % 5 != 0 && !(r == kept && run == 4 && l == 2)) continue;
                    const auto xr = data.cached_x(r, l);
                    float s = 0;
                    for (int i = 0; i < kD; ++i) s += (xt[i] - xr[i]) * (xt[i] - xr[i]);
                    dist.emplace_back(s, r);
                }
                std::sort(dist.begin(), dist.end());
                std::vector<float> want(kD, 0.0f);
                for (int n = 0; n < 2; ++n) {
                    const auto xr = data.cached_x(dist[n].second, l);
                    for (int i = 0; i < kD; ++i) want[i] += xr[i] / 2.0f;
                }
                add(t, want);
            }
            for (int32_t t = 28; t <= 40; ++t) add(t, data.cached_x(t, l));
            return rows;
        };

        for (int32_t l = 0; l < kLayers; ++l) {
            std::vector<float> kk(data.x[40].begin() + l * kD,
                                  data.x[40].begin() + l * kD + kKvDim);
            std::vector<float> vv(data.x[40].begin() + l * kD + kKvDim,
                                  data.x[40].begin() + (l + 1) * kD);
            k::rope(kk.data(), kKvHeads, kHeadDim, 40, 10000.0f, k::RopeStyle::kInterleaved);
            EXPECT_TRUE(c.store(l, 0, 1, kk.data(), vv.data(), kKvDim).ok());
            std::vector<float> got(kHeads * kHeadDim);
            const bool attended = c.attend(l, kShape, q.data(), kHeads * kHeadDim, 1, got.data(),
                                           kHeads * kHeadDim, threads)
                                      .value();
            if (l == 0) {
                EXPECT_FALSE(attended) << "a full layer: the caller attends its view";
                EXPECT_EQ(c.view(l, 1).n, 41) << "a full layer sees every token";
            } else {
                ASSERT_TRUE(attended) << "a sparse layer attends its latent tokens itself";
                int32_t chosen_refs = 0;
                for (int32_t t : chosen) chosen_refs += exact(t);
                EXPECT_EQ(c.view(l, 1).n, 4 + chosen_refs + 12 + 1)
                    << "the view: sinks, chosen references, buffer, the new token";
                // Softmax attention over the expected rows, head by head.
                const auto rows = expected_rows(l);
                for (int h = 0; h < kHeads; ++h) {
                    const int g = h / (kHeads / kKvHeads);
                    std::vector<double> sc;
                    double mx = -1e30, sum = 0;
                    for (size_t j = 0; j < rows.size(); ++j) {
                        const auto& r = rows[j];
                        double s = 0;
                        for (int d = 0; d < kHeadDim; ++d)
                            s += double(q[h * kHeadDim + d]) * r[g * kHeadDim + d];
                        sc.push_back(s * kShape.scale);
                        // The chosen latent tokens: reconstructed.
                        if (j >= 4 && j < 4 + chosen.size() && !exact(chosen[j - 4]))
                            sc.back() += logit_correction(p, l, q.data(), h);
                        mx = std::max(mx, sc.back());
                    }
                    std::vector<double> o(kHeadDim, 0.0);
                    for (size_t j = 0; j < rows.size(); ++j) {
                        const double p = std::exp(sc[j] - mx);
                        sum += p;
                        for (int d = 0; d < kHeadDim; ++d)
                            o[d] += p * rows[j][kKvDim + g * kHeadDim + d];
                    }
                    for (int d = 0; d < kHeadDim; ++d) {
                        ASSERT_NEAR(got[h * kHeadDim + d], o[d] / sum, 5e-3)
                            << "layer " << l << " head " << h << " dim " << d;
                    }
                }
            }
            EXPECT_TRUE(
                c.observe(l, kShape, q.data(), kHeads * kHeadDim, nullptr, 0, 1, threads).ok());
        }
        EXPECT_TRUE(c.commit(1).ok());
        EXPECT_EQ(c.n_tokens(), 41);
    }
}

// A cache over zero_decoder_profile (key errors set or not) after a chunk of 40 tokens
// (region [4, 28): 19 latents and 5 references; buffer [28, 40)), with room reserved for a
// next chunk of n tokens and that chunk's random K, V and queries.
struct AfterFirstChunk {
    DeltaKvProfile p;
    ThreadPool threads{2};
    std::unique_ptr<DeltaKvSequenceCache> cache;
    Data data;
    std::vector<float> kk, vv, q;
};

void after_first_chunk(AfterFirstChunk& s, uint32_t seed, bool key_errors, const DeltaKvOptions& o,
                       int32_t n) {
    std::mt19937 rng(seed);
    s.p = zero_decoder_profile(rng);
    if (key_errors) set_key_errors(s.p);
    if (s.data.same_layers) {  // layer 2 compresses as layer 1 does, with a decoder not zero
        std::normal_distribution<float> nd(0.0f, 0.3f);
        for (auto& x : s.p.storage[4 * 1 + 3]) x = nd(rng);  // layer 1's wd
        s.p.layers[2] = s.p.layers[1];
        prepare_int4_decoders(s.p);
    }
    auto made = DeltaKvSequenceCache::create(s.p, o, s.threads);
    ASSERT_TRUE(made.ok());
    s.cache = std::move(*made);
    s.data.chunk(*s.cache, 40, s.threads);
    ASSERT_EQ(s.cache->compressed_tokens(), 19);
    ASSERT_TRUE(s.cache->reserve(n).ok());
    s.kk.resize(static_cast<size_t>(n) * kKvDim);
    s.vv.resize(static_cast<size_t>(n) * kKvDim);
    s.q.resize(static_cast<size_t>(n) * kHeads * kHeadDim);
    for (auto* v : {&s.kk, &s.vv, &s.q}) {
        for (auto& t : *v) t = s.data.nd(s.data.rng);
    }
}

TEST(DeltaKvCache, AChunkAttendsTheWholeCompressedRegionUnlessCapped) {
    for (int32_t cap : {0, 10}) {
        SCOPED_TRACE("prefill_select " + std::to_string(cap));
        DeltaKvOptions o = options();
        o.prefill_select = cap;
        // A second chunk of 4 at positions 40..43: its sparse layers see the sinks, the
        // region's tokens (all of them, or the 10 best scored), the buffer and the chunk: the
        // region's latent tokens reconstructed apart from the view.
        constexpr int32_t kNew = 4;
        AfterFirstChunk s;
        ASSERT_NO_FATAL_FAILURE(after_first_chunk(s, 3, false, o, kNew));
        DeltaKvSequenceCache& c = *s.cache;
        const auto &kk = s.kk, &vv = s.vv, &q = s.q;
        for (int32_t l = 0; l < kLayers; ++l) {
            EXPECT_TRUE(c.store(l, 0, kNew, kk.data(), vv.data(), kKvDim).ok());
            const k::KvView v = c.view(l, kNew);
            const int32_t want = l == 0 || cap == 0 ? 44 : 4 + cap + 12 + kNew;
            const auto& rebuilt = c.reconstructed_positions();
            EXPECT_EQ(v.n + (l == 0 ? 0 : static_cast<int32_t>(rebuilt.size())), want)
                << "layer " << l;
            if (l > 0) {
                EXPECT_EQ(c.reconstructed_view().n, static_cast<int32_t>(rebuilt.size()));
                for (int32_t p : rebuilt) EXPECT_TRUE(p >= 4 && p < 28 && (p - 4) % 5 != 0) << p;
            }
            EXPECT_TRUE(
                c.observe(l, kShape, q.data(), kHeads * kHeadDim, nullptr, 0, kNew, s.threads)
                    .ok());
        }
        EXPECT_TRUE(c.commit(kNew).ok());
        EXPECT_EQ(c.n_tokens(), 40 + kNew);
    }
}

// Sparse layers before the first full layer have no observation layer: a chunk's view there
// holds the whole compressed region; a decode step's holds the full-precision tokens and
// attend() takes every latent one. The layers after the full layer select as usual.
TEST(DeltaKvCache, SparseLayersBeforeTheFirstFullLayerAttendTheWholeRegion) {
    DeltaKvOptions o = options();
    o.full_layer = {0, 1, 0};
    o.prefill_select = 10;
    constexpr int32_t kNew = 4;
    AfterFirstChunk s;
    ASSERT_NO_FATAL_FAILURE(after_first_chunk(s, 3, false, o, kNew));
    DeltaKvSequenceCache& c = *s.cache;
    EXPECT_EQ(c.n_full_layers(), 1);
    for (int32_t l = 0; l < kLayers; ++l) {
        EXPECT_TRUE(c.store(l, 0, kNew, s.kk.data(), s.vv.data(), kKvDim).ok());
        const int32_t want = l < 2 ? 44 : 4 + 10 + 12 + kNew;
        const int32_t rebuilt = static_cast<int32_t>(c.reconstructed_positions().size());
        EXPECT_EQ(c.view(l, kNew).n + (l == 1 ? 0 : rebuilt), want) << "layer " << l;
        EXPECT_TRUE(
            c.observe(l, kShape, s.q.data(), kHeads * kHeadDim, nullptr, 0, kNew, s.threads).ok());
    }
    EXPECT_TRUE(c.commit(kNew).ok());
    // Decode steps. The first: layer 0 sees sinks, the region's references, the buffer and
    // the new token in its view, and attends every latent token of the region besides. The
    // next: layer 0 takes the latent tokens layer 1 selected at the step before (half the
    // region, select_ratio 0.5), layer 2 makes its own selection.
    const int32_t latents = c.compressed_tokens();
    std::vector<int32_t> lead_selected, observed_selected;
    for (int32_t step = 0; step < 2; ++step) {
        ASSERT_TRUE(c.reserve(1).ok());
        for (int32_t l = 0; l < kLayers; ++l) {
            EXPECT_TRUE(c.store(l, 0, 1, s.kk.data(), s.vv.data(), kKvDim).ok());
            const k::KvView v = c.view(l, 1);
            if (l == 0) {
                if (step == 0) {
                    EXPECT_EQ(v.n, 45 - latents) << "every full-precision token";
                }
                lead_selected.push_back(c.selected_latent_tokens());
                std::vector<float> out(kHeads * kHeadDim);
                EXPECT_TRUE(c.attend(0, kShape, s.q.data(), kHeads * kHeadDim, 1, out.data(),
                                     kHeads * kHeadDim, s.threads)
                                .value());
                for (float x : out) ASSERT_TRUE(std::isfinite(x));
            }
            if (l == 2) observed_selected.push_back(c.selected_latent_tokens());
            EXPECT_TRUE(
                c.observe(l, kShape, s.q.data(), kHeads * kHeadDim, nullptr, 0, 1, s.threads).ok());
        }
        EXPECT_TRUE(c.commit(1).ok());
    }
    ASSERT_EQ(c.compressed_tokens(), latents) << "no compression between the steps";
    EXPECT_EQ(lead_selected[0], latents);
    EXPECT_EQ(lead_selected[1], observed_selected[0]);
    EXPECT_LT(lead_selected[1], latents);
    o.full_layer = {0, 0, 0};
    EXPECT_EQ(DeltaKvSequenceCache::create(s.p, o, s.threads).status().code(),
              StatusCode::kInvalidArgument)
        << "no full layer";
}

// Scorer layers (score_every): in a decode step a scorer scores every latent token of the
// region and attends the select_ratio share it picks, as the layers up to the next scorer
// do. Here layers 1 and 2 hold the same K and V and have the same compressors, so attending
// the same pick they give the same output, which is not that of attending the whole region;
// picking everything gives exactly that. With whole keys and with a sketch of one RoPE pair
// per KV head (score_dims).
TEST(DeltaKvCache, AScorerPicksWhatItAndTheLayersAfterItAttend) {
    for (float dims : {1.0f, 0.25f}) {
        SCOPED_TRACE(dims);
        constexpr int32_t kNew = 4;
        constexpr int kLd = kHeads * kHeadDim;
        DeltaKvOptions half = options();
        half.score_every = 2;  // layer 1 scores, layer 2 takes its pick
        half.score_dims = dims;
        DeltaKvOptions all = half;
        all.select_ratio = 1.0f;
        DeltaKvOptions whole = options();
        whole.select_ratio = 1.0f;
        AfterFirstChunk s[3];
        const DeltaKvOptions* o[3] = {&half, &all, &whole};
        for (int i = 0; i < 3; ++i) {
            s[i].data.same_layers = true;
            ASSERT_NO_FATAL_FAILURE(after_first_chunk(s[i], 3, false, *o[i], kNew));
            for (int32_t l = 0; l < kLayers; ++l) {
                EXPECT_TRUE(
                    s[i].cache->store(l, 0, kNew, s[i].kk.data(), s[i].vv.data(), kKvDim).ok());
                EXPECT_TRUE(
                    s[i].cache
                        ->observe(l, kShape, s[i].q.data(), kLd, nullptr, 0, kNew, s[i].threads)
                        .ok());
            }
            EXPECT_TRUE(s[i].cache->commit(kNew).ok());
            ASSERT_TRUE(s[i].cache->reserve(1).ok());
        }
        const int32_t latents = s[0].cache->compressed_tokens();
        ASSERT_GT(latents, 4);
        // out[i][l - 1]: cache i's output at sparse layer l; attended[i][l - 1] its latent tokens.
        std::vector<float> out[3][2];
        int32_t attended[3][2];
        for (int i = 0; i < 3; ++i) {
            ASSERT_EQ(s[i].cache->compressed_tokens(), latents);
            DeltaKvSequenceCache& c = *s[i].cache;
            for (int32_t l = 0; l < kLayers; ++l) {
                EXPECT_TRUE(c.store(l, 0, 1, s[i].kk.data(), s[i].vv.data(), kKvDim).ok());
                if (l == 0) {
                    EXPECT_TRUE(
                        c.observe(l, kShape, s[i].q.data(), kLd, nullptr, 0, 1, s[i].threads).ok());
                    continue;
                }
                std::vector<float>& got = out[i][l - 1];
                got.resize(kLd);
                ASSERT_TRUE(
                    c.attend(l, kShape, s[i].q.data(), kLd, 1, got.data(), kLd, s[i].threads)
                        .value());
                attended[i][l - 1] = c.attended_latent_tokens();
            }
        }
        EXPECT_EQ(attended[0][0], (latents + 1) / 2) << "the scorer: half, select_ratio 0.5";
        EXPECT_EQ(attended[0][1], (latents + 1) / 2) << "the layer after it";
        float to_whole = 0.0f;
        for (int j = 0; j < kLd; ++j) {
            ASSERT_FLOAT_EQ(out[0][0][j], out[0][1][j]) << "the same pick, " << j;
            ASSERT_FLOAT_EQ(out[2][0][j], out[2][1][j]) << "the same layers, " << j;
            to_whole = std::max(to_whole, std::abs(out[0][0][j] - out[2][0][j]));
            for (int l = 0; l < 2; ++l) {
                ASSERT_FLOAT_EQ(out[1][l][j], out[2][l][j])
                    << "picking everything, layer " << l + 1;
            }
        }
        EXPECT_GT(to_whole, 0.0f) << "half the region is not the whole";
        EXPECT_EQ(attended[1][0], latents);
        EXPECT_EQ(attended[1][1], latents);
        half.score_every = -1;
        EXPECT_EQ(DeltaKvSequenceCache::create(s[0].p, half, s[0].threads).status().code(),
                  StatusCode::kInvalidArgument);
        half.score_every = 2;
        for (float bad : {0.0f, 1.5f, std::nanf("")}) {
            half.score_dims = bad;
            EXPECT_EQ(DeltaKvSequenceCache::create(s[0].p, half, s[0].threads).status().code(),
                      StatusCode::kInvalidArgument)
                << "score_dims " << bad;
        }
    }
}

// A scorer's sketch (score_dims < 1) scores with the RoPE pairs where the query is largest.
// Where the query has nothing outside one pair per head, a sketch of one pair per KV head
// scores as whole keys do and must pick the same tokens, so both give the same output (to
// rounding: the references are gathered in another order); where the query is spread over
// every pair, the sketch's pick differs.
TEST(DeltaKvCache, AScorersSketchKeepsThePairsWhereTheQueryIs) {
    constexpr int32_t kNew = 4;
    constexpr int kLd = kHeads * kHeadDim;
    const auto scorer_output = [&](float dims, bool one_pair, std::vector<float>& got) {
        DeltaKvOptions o = options();
        o.score_every = 2;
        o.score_dims = dims;
        AfterFirstChunk s;
        s.data.same_layers = true;
        ASSERT_NO_FATAL_FAILURE(after_first_chunk(s, 5, false, o, kNew));
        for (int32_t l = 0; l < kLayers; ++l) {
            EXPECT_TRUE(s.cache->store(l, 0, kNew, s.kk.data(), s.vv.data(), kKvDim).ok());
            EXPECT_TRUE(
                s.cache->observe(l, kShape, s.q.data(), kLd, nullptr, 0, kNew, s.threads).ok());
        }
        EXPECT_TRUE(s.cache->commit(kNew).ok());
        ASSERT_TRUE(s.cache->reserve(1).ok());
        if (one_pair) {  // interleaved RoPE: pair 2 is dimensions 4 and 5 of each head
            for (int j = 0; j < kLd; ++j) {
                if (j % kHeadDim != 4 && j % kHeadDim != 5) s.q[j] = 0.0f;
            }
        }
        for (int32_t l = 0; l < 2; ++l) {
            EXPECT_TRUE(s.cache->store(l, 0, 1, s.kk.data(), s.vv.data(), kKvDim).ok());
            if (l == 0) {
                EXPECT_TRUE(
                    s.cache->observe(l, kShape, s.q.data(), kLd, nullptr, 0, 1, s.threads).ok());
            }
        }
        got.resize(kLd);
        ASSERT_TRUE(
            s.cache->attend(1, kShape, s.q.data(), kLd, 1, got.data(), kLd, s.threads).value());
        ASSERT_EQ(s.cache->attended_latent_tokens(), (s.cache->compressed_tokens() + 1) / 2);
    };
    std::vector<float> whole, sketch;
    ASSERT_NO_FATAL_FAILURE(scorer_output(1.0f, true, whole));
    ASSERT_NO_FATAL_FAILURE(scorer_output(0.25f, true, sketch));
    for (int j = 0; j < kLd; ++j)
        ASSERT_NEAR(sketch[j], whole[j], 1e-5f * (1.0f + std::abs(whole[j]))) << j;
    ASSERT_NO_FATAL_FAILURE(scorer_output(1.0f, false, whole));
    ASSERT_NO_FATAL_FAILURE(scorer_output(0.25f, false, sketch));
    float diff = 0.0f;
    for (int j = 0; j < kLd; ++j) diff = std::max(diff, std::abs(sketch[j] - whole[j]));
    EXPECT_GT(diff, 1e-3f) << "one pair of four is not the whole key here";
}

// A chunk with the profile's key errors: attention over its view and the region's latent
// tokens reconstructed apart, their logits carrying the correction, computed here from the
// cache's own rows.
TEST(DeltaKvCache, AChunkCorrectsTheLogitsOfReconstructedTokens) {
    constexpr int32_t kNew = 5;
    AfterFirstChunk s;
    ASSERT_NO_FATAL_FAILURE(after_first_chunk(s, 5, true, options(), kNew));
    DeltaKvSequenceCache& c = *s.cache;
    const DeltaKvProfile& p = s.p;
    const auto &kk = s.kk, &vv = s.vv, &q = s.q;
    constexpr int kLd = kHeads * kHeadDim;
    for (int32_t l = 0; l < kLayers; ++l) {
        EXPECT_TRUE(c.store(l, 0, kNew, kk.data(), vv.data(), kKvDim).ok());
        std::vector<float> got(kNew * kLd);
        const bool attended =
            c.attend(l, kShape, q.data(), kLd, kNew, got.data(), kLd, s.threads).value();
        if (l == 0) {
            EXPECT_FALSE(attended) << "a full layer: the caller attends its view";
        } else {
            ASSERT_TRUE(attended);
            // Every token: 4 sinks, the region [4, 28) (references in the view, latent
            // tokens reconstructed), the buffer [28, 40), the chunk.
            struct Entry {
                int32_t pos;
                k::KvView view;
                int32_t e;
            };
            std::vector<Entry> all;
            const k::KvView v = c.view(l, kNew);
            const std::vector<int32_t> vp = c.view_positions(l, kNew);
            ASSERT_EQ(static_cast<int32_t>(vp.size()), v.n);
            for (int32_t e = 0; e < v.n; ++e) all.push_back({vp[e], v, e});
            const k::KvView r = c.reconstructed_view();
            for (int32_t e = 0; e < r.n; ++e) all.push_back({c.reconstructed_positions()[e], r, e});
            std::sort(all.begin(), all.end(),
                      [](const Entry& x, const Entry& y) { return x.pos < y.pos; });
            ASSERT_EQ(all.size(), 40u + kNew);
            for (int32_t e = 0; e < 40 + kNew; ++e) ASSERT_EQ(all[e].pos, e);
            const auto row = [&](const Entry& x, bool key, int g, int d) {
                const uint8_t* base = key ? x.view.k : x.view.v;
                const auto* rw =
                    reinterpret_cast<const uint16_t*>(base + x.view.slots[x.e] * x.view.row_stride);
                return fp16_to_fp32(rw[g * kHeadDim + d]);
            };
            for (int32_t i = 0; i < kNew; ++i) {
                for (int h = 0; h < kHeads; ++h) {
                    const int g = h / (kHeads / kKvHeads);
                    const int32_t visible = 40 + i + 1;
                    std::vector<double> sc(visible);
                    double mx = -1e30, sum = 0;
                    for (int32_t e = 0; e < visible; ++e) {
                        double s = 0;
                        for (int d = 0; d < kHeadDim; ++d)
                            s += double(q[i * kLd + h * kHeadDim + d]) * row(all[e], true, g, d);
                        sc[e] = s * kShape.scale;
                        if (e >= 4 && e < 28 && (e - 4) % 5 != 0)
                            sc[e] += logit_correction(p, l, q.data() + i * kLd, h);
                        mx = std::max(mx, sc[e]);
                    }
                    std::vector<double> o(kHeadDim, 0.0);
                    for (int32_t e = 0; e < visible; ++e) {
                        const double w = std::exp(sc[e] - mx);
                        sum += w;
                        for (int d = 0; d < kHeadDim; ++d) o[d] += w * row(all[e], false, g, d);
                    }
                    for (int d = 0; d < kHeadDim; ++d) {
                        ASSERT_NEAR(got[i * kLd + h * kHeadDim + d], o[d] / sum, 2e-3)
                            << "layer " << l << " query " << i << " head " << h << " dim " << d;
                    }
                }
            }
        }
        EXPECT_TRUE(c.observe(l, kShape, q.data(), kLd, nullptr, 0, kNew, s.threads).ok());
    }
    EXPECT_TRUE(c.commit(kNew).ok());
}

// Decode-step helpers (pins, following): chunks of 5 tokens after after_first_chunk.
constexpr int32_t kAimNew = 5, kAimLd = kHeads * kHeadDim;

// In a chunk, after a sparse layer's store: the K row of position pos, exact (in its view)
// or reconstructed.
const uint16_t* key_row(const DeltaKvSequenceCache& c, int32_t layer, int32_t n_new, int32_t pos) {
    const auto& rebuilt = c.reconstructed_positions();
    const auto it = std::find(rebuilt.begin(), rebuilt.end(), pos);
    const k::KvView v = it != rebuilt.end() ? c.reconstructed_view() : c.view(layer, n_new);
    const std::vector<int32_t> at = it != rebuilt.end() ? rebuilt : c.view_positions(layer, n_new);
    const auto e = std::find(at.begin(), at.end(), pos) - at.begin();
    EXPECT_LT(e, static_cast<std::ptrdiff_t>(at.size()))
        << "position " << pos << " is not attended";
    return reinterpret_cast<const uint16_t*>(v.k + v.slots[e] * v.row_stride);
}

// A chunk whose every query in every head points at position `target`'s keys as the first
// sparse layer reconstructed them. The aimed query row goes to *aimed when given.
void aimed_chunk(AfterFirstChunk& s, int32_t target, std::vector<float>* aimed = nullptr) {
    DeltaKvSequenceCache& c = *s.cache;
    for (int32_t l = 0; l < kLayers; ++l) {
        EXPECT_TRUE(c.store(l, 0, kAimNew, s.kk.data(), s.vv.data(), kKvDim).ok());
        if (l == 1) {
            const auto* kr = key_row(c, l, kAimNew, target);
            for (int h = 0; h < kHeads; ++h) {
                const int g = h / (kHeads / kKvHeads);
                double norm2 = 0;
                for (int d = 0; d < kHeadDim; ++d)
                    norm2 += std::pow(fp16_to_fp32(kr[g * kHeadDim + d]), 2);
                for (int32_t i = 0; i < kAimNew; ++i) {
                    for (int d = 0; d < kHeadDim; ++d)  // logit 40 for the target
                        s.q[i * kAimLd + h * kHeadDim + d] = static_cast<float>(
                            40.0 * fp16_to_fp32(kr[g * kHeadDim + d]) / (norm2 * kShape.scale));
                }
            }
            if (aimed != nullptr) aimed->assign(s.q.begin(), s.q.begin() + kAimLd);
        }
        std::vector<float> out(kAimNew * kAimLd);
        EXPECT_TRUE(
            c.attend(l, kShape, s.q.data(), kAimLd, kAimNew, out.data(), kAimLd, s.threads).ok());
        EXPECT_TRUE(c.observe(l, kShape, s.q.data(), kAimLd, nullptr, 0, kAimNew, s.threads).ok());
    }
    EXPECT_TRUE(c.commit(kAimNew).ok());
}

// A query turned away from `target`'s keys in the observation layer (layer 0, full).
std::vector<float> away_from(const AfterFirstChunk& s, int32_t target) {
    std::vector<float> key(s.data.x[target].begin(), s.data.x[target].begin() + kKvDim);
    k::rope(key.data(), kKvHeads, kHeadDim, target, 10000.0f, k::RopeStyle::kInterleaved);
    std::vector<float> q(kAimLd);
    for (int h = 0; h < kHeads; ++h) {
        for (int d = 0; d < kHeadDim; ++d)
            q[h * kHeadDim + d] = -key[(h / (kHeads / kKvHeads)) * kHeadDim + d];
    }
    return q;
}

// A decode step with query q[l] in layer l: the positions of the region layer 1 attends
// (latent and exact), sorted.
std::vector<int32_t> decode_step(AfterFirstChunk& s, const std::vector<std::vector<float>>& q) {
    DeltaKvSequenceCache& c = *s.cache;
    EXPECT_TRUE(c.reserve(1).ok());
    std::vector<int32_t> attended;
    for (int32_t l = 0; l < kLayers; ++l) {
        EXPECT_TRUE(c.store(l, 0, 1, s.kk.data(), s.vv.data(), kKvDim).ok());
        if (l == 1) {
            attended = c.selected_latent_positions();
            const auto& exact = c.selected_exact_positions();
            attended.insert(attended.end(), exact.begin(), exact.end());
            std::sort(attended.begin(), attended.end());
        }
        std::vector<float> out(kAimLd);
        EXPECT_TRUE(
            c.attend(l, kShape, q[l].data(), kAimLd, 1, out.data(), kAimLd, s.threads).ok());
        for (float x : out) EXPECT_TRUE(std::isfinite(x));
        EXPECT_TRUE(c.observe(l, kShape, q[l].data(), kAimLd, nullptr, 0, 1, s.threads).ok());
    }
    EXPECT_TRUE(c.commit(1).ok());
    return attended;
}

std::vector<int32_t> step_away_from(AfterFirstChunk& s, int32_t target) {
    const auto q = away_from(s, target);
    return decode_step(s, std::vector<std::vector<float>>(kLayers, q));
}

bool has(const std::vector<int32_t>& v, int32_t p) {
    return std::find(v.begin(), v.end(), p) != v.end();
}

// Pins (pin_ratio): a chunk's last queries, here all aimed at one token of the compressed
// region (a latent token's reconstructed keys, or a reference's exact ones), pin it, and
// every decode step after the chunk attends it although the observation layer's pick leaves
// it out; until the next chunk pins what its queries attend, or a truncation. Without pins
// the step does not attend it: a reference, exact, is attended only when picked, as a
// latent token is.
TEST(DeltaKvCache, AChunkPinsWhatItsLastQueriesAttendForTheDecodeStepsAfterIt) {
    constexpr int32_t kOther = 22;     // a latent token (the references: 4, 9, 14, 19, 24)
    for (int32_t target : {12, 14}) {  // a latent token, a reference
        std::vector<std::vector<int32_t>> unpinned;  // each step's, without pins
        for (float pin : {0.0f, 0.05f}) {
            SCOPED_TRACE("target " + std::to_string(target) + ", pin_ratio " + std::to_string(pin));
            DeltaKvOptions o = options();
            o.pin_ratio = pin;
            o.follow = 0;  // the pins alone (following: the next test)
            AfterFirstChunk s;
            s.data.loud = {12, 14, kOther};  // so that aiming at their keys takes most attention
            ASSERT_NO_FATAL_FAILURE(after_first_chunk(s, 5, true, o, kAimNew));
            DeltaKvSequenceCache& c = *s.cache;
            aimed_chunk(s, target);
            // 2 pins: ceil(0.05 * 24), the region's tokens when the chunk scored them.
            ASSERT_EQ(c.pinned().size(), pin > 0 ? 2u : 0u);
            for (int step = 0; step < 2; ++step) {
                const auto attended = step_away_from(s, target);
                EXPECT_EQ(has(attended, target), pin > 0) << "step " << step;
                if (pin == 0.0f) {
                    unpinned.push_back(attended);
                    continue;
                }
                // The same pick as without pins, and the pins.
                std::vector<int32_t> want = unpinned[step];
                want.insert(want.end(), c.pinned().begin(), c.pinned().end());
                std::sort(want.begin(), want.end());
                want.erase(std::unique(want.begin(), want.end()), want.end());
                EXPECT_EQ(attended, want) << "step " << step;
            }
            if (pin == 0.0f) continue;
            EXPECT_TRUE(has(c.pinned(), target));
            // Shipped to a decode node as hints: taken back as they were; what is not a list of
            // compressed positions in order is refused and changes nothing.
            const std::vector<int32_t> pins = c.pinned();
            const auto hints = c.codec()->export_hints();
            ASSERT_EQ(hints.size(), 4 * (1 + pins.size()));
            auto bad = hints;
            bad[4] = 2;  // position 2: a sink
            bad[5] = bad[6] = bad[7] = 0;
            EXPECT_EQ(c.codec()->import_hints(bad).code(), StatusCode::kDataLoss);
            EXPECT_EQ(c.codec()
                          ->import_hints(std::span<const uint8_t>(hints.data(), hints.size() - 1))
                          .code(),
                      StatusCode::kDataLoss);
            EXPECT_EQ(c.pinned(), pins);
            ASSERT_TRUE(c.codec()->import_hints({}).ok());
            EXPECT_TRUE(c.pinned().empty());
            ASSERT_TRUE(c.codec()->import_hints(hints).ok());
            EXPECT_EQ(c.pinned(), pins);
            // The next chunk pins what it attends.
            ASSERT_TRUE(c.reserve(kAimNew).ok());
            aimed_chunk(s, kOther);
            EXPECT_TRUE(has(c.pinned(), kOther));
            EXPECT_FALSE(has(c.pinned(), target));
            EXPECT_FALSE(has(step_away_from(s, target), target));
            c.truncate(30);
            EXPECT_TRUE(c.pinned().empty()) << "a truncation forgets the pins";
        }
    }
}

// Following (follow): a decode step whose sparse layers read one latent token most makes the
// next step attend it and the follow_ahead positions after it (reading on), besides that
// step's own pick and the pins; with follow 0 the next step attends only its pick and the
// pins.
TEST(DeltaKvCache, ADecodeStepAttendsWhatTheStepBeforeItReadMostAndWhatFollowsIt) {
    constexpr int32_t kTarget = 12;              // a latent token; 14 is a reference
    std::vector<std::vector<int32_t>> attended;  // the second step's, by follow
    for (int32_t follow : {0, 1}) {
        SCOPED_TRACE("follow " + std::to_string(follow));
        DeltaKvOptions o = options();
        o.select_ratio = 0.2f;
        o.pin_ratio = 0.05f;  // the chunk pins 12, so that the first step attends it
        o.follow = follow;
        o.follow_ahead = 3;
        AfterFirstChunk s;
        s.data.loud = {kTarget};
        ASSERT_NO_FATAL_FAILURE(after_first_chunk(s, 5, true, o, kAimNew));
        DeltaKvSequenceCache& c = *s.cache;
        std::vector<float> aimed;
        aimed_chunk(s, kTarget, &aimed);
        ASSERT_TRUE(has(c.pinned(), kTarget));
        // First step: layer 1 reads 12 (the chunk's aim), layer 2 reads evenly (a zero query).
        const auto away = away_from(s, kTarget);
        const auto first = decode_step(s, {away, aimed, std::vector<float>(kAimLd, 0.0f)});
        ASSERT_TRUE(has(first, kTarget));
        // Second step: its own pick, the pins and, following, 12 to 15.
        attended.push_back(step_away_from(s, kTarget));
    }
    std::vector<int32_t> want = attended[0];
    for (int32_t p = kTarget; p <= kTarget + 3; ++p) want.push_back(p);
    std::sort(want.begin(), want.end());
    want.erase(std::unique(want.begin(), want.end()), want.end());
    EXPECT_EQ(attended[1], want);
    // 13, after the token read most, only by following.
    EXPECT_FALSE(has(attended[0], kTarget + 1)) << ::testing::PrintToString(attended[0]);
}

// The key errors calibration stores: with a zero decoder a latent token's keys are the mean of
// its k nearest references, so the variance is that mean's squared error, per KV head and
// RoPE pair, over the latent tokens.
TEST(DeltaKvCache, KeyErrorVarianceIsTheReconstructedKeysSquaredError) {
    for (int bits : {4, 16}) {
        SCOPED_TRACE("latent bits " + std::to_string(bits));
        std::mt19937 rng(9);
        const DeltaKvProfile p = zero_decoder_profile(rng);
        DeltaKvOptions o = options();
        o.latent_bits = bits;
        constexpr int32_t kN = 60;
        std::normal_distribution<float> nd(0.0f, 1.0f);
        std::vector<float> x(kN * kD);
        for (auto& t : x) t = nd(rng);
        ThreadPool threads(2);
        const std::vector<float> got = deltakv_key_error_variance(p, 1, x.data(), kN, o, threads);
        ASSERT_EQ(got.size(), static_cast<size_t>(kKvHeads * kHeadDim / 2));
        std::vector<double> want(got.size(), 0.0);
        int n_latent = 0;
        for (int32_t t = 4; t < kN; ++t) {
            if ((t - 4) % 5 == 0) continue;
            ++n_latent;
            std::vector<std::pair<double, int32_t>> dist;
            for (int32_t r = 0; r <= t; ++r) {
                if (r >= 4 && (r - 4) % 5 != 0) continue;
                double s = 0;
                for (int i = 0; i < kD; ++i)
                    s += double(x[t * kD + i] - x[r * kD + i]) * (x[t * kD + i] - x[r * kD + i]);
                dist.emplace_back(s, r);
            }
            std::sort(dist.begin(), dist.end());
            for (int i = 0; i < kKvDim; ++i) {
                const double mean =
                    (double(x[dist[0].second * kD + i]) + x[dist[1].second * kD + i]) / 2.0;
                const double e = mean - x[t * kD + i];
                want[(i / kHeadDim) * (kHeadDim / 2) + (i % kHeadDim) / 2] += e * e;
            }
        }
        for (size_t i = 0; i < got.size(); ++i) {
            EXPECT_NEAR(got[i], want[i] / (2.0 * n_latent), 1e-4 * (1.0 + want[i])) << "pair " << i;
        }
    }
}

// A prompt fed in chunks, told that more follows (expect_more), stays exact until its last
// chunk, which compresses it as one call would: the same cache, byte for byte. While it
// waits it holds no more than bytes_bound and prefill_bytes_bound allow.
TEST(DeltaKvCache, APromptInChunksIsCompressedAtItsLastChunk) {
    std::mt19937 rng(1);
    const DeltaKvProfile p = zero_decoder_profile(rng);
    ThreadPool threads(2);
    auto one = DeltaKvSequenceCache::create(p, options(), threads);
    auto chunked = DeltaKvSequenceCache::create(p, options(), threads);
    ASSERT_TRUE(one.ok() && chunked.ok());
    constexpr int32_t kPrompt = 120, kChunk = 20;
    Data a;
    a.chunk(**one, kPrompt, threads);
    Data b;
    b.x = a.x;
    const size_t bound =
        (*chunked)->bytes_bound(kPrompt) + (*chunked)->prefill_bytes_bound(kPrompt, kPrompt);
    for (int32_t at = 0; at < kPrompt; at += kChunk) {
        (*chunked)->expect_more(kPrompt - at - kChunk);
        b.chunk(**chunked, kChunk, threads);
        EXPECT_LE((*chunked)->held_bytes(), bound) << "after the chunk at " << at;
        if (at + kChunk < kPrompt)
            EXPECT_EQ((*chunked)->compressed_tokens(), 0) << "after the chunk at " << at;
    }
    EXPECT_GT((*one)->compressed_tokens(), 60);
    EXPECT_EQ((*chunked)->compressed_tokens(), (*one)->compressed_tokens());
    auto sa = (*one)->codec()->export_state();
    auto sb = (*chunked)->codec()->export_state();
    ASSERT_TRUE(sa.ok() && sb.ok());
    EXPECT_EQ(*sa, *sb);
    // A prompt cut short (a cancelled turn) forgets it: the next call compresses as usual.
    (*chunked)->truncate(90);
    const int32_t kept = (*chunked)->compressed_tokens();
    (*chunked)->expect_more(100);
    (*chunked)->truncate(90);
    b.x.resize(90);
    b.chunk(**chunked, 3 * options().window, threads);
    EXPECT_GT((*chunked)->compressed_tokens(), kept);
}

// After a prompt compressed at its end, the slots its latents left are given back: the pools'
// memory is the exact tokens' rows, not the prompt's; so after a truncation.
TEST(DeltaKvCache, ThePagesOfCompressedTokensAreGivenBack) {
    std::mt19937 rng(1);
    const DeltaKvProfile p = zero_decoder_profile(rng);
    ThreadPool threads(2);
    DeltaKvOptions o = options();
    o.n_ctx = 8192;
    auto c = DeltaKvSequenceCache::create(p, o, threads);
    ASSERT_TRUE(c.ok());
    Data data;
    constexpr int32_t kPrompt = 4000, kChunk = 500;
    for (int32_t at = 0; at < kPrompt; at += kChunk) {
        (*c)->expect_more(kPrompt - at - kChunk);
        data.chunk(**c, kChunk, threads);
    }
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t row = kKvDim * 2;  // fp16 K or V of one token in one layer
    const auto pages = [&](size_t rows) { return (rows * row + page - 1) / page + 1; };
    // K and V of one full layer for every token, of two sparse layers for the exact ones.
    const auto most = [&](int32_t n, int32_t exact) {
        return (2 * pages(static_cast<size_t>(n)) + 4 * pages(static_cast<size_t>(exact))) * page;
    };
    const int32_t exact = (*c)->n_tokens() - (*c)->compressed_tokens();
    EXPECT_LT(exact, kPrompt / 4);
    EXPECT_LE((*c)->resident_bytes(), most(kPrompt, exact));
    (*c)->truncate(1000);
    EXPECT_LE((*c)->resident_bytes(), most(1000, (*c)->n_tokens() - (*c)->compressed_tokens()));
}

TEST(DeltaKvCache, TruncateIntoTheCompressedRegionAndGoOn) {
    std::mt19937 rng(1);
    const DeltaKvProfile p = zero_decoder_profile(rng);
    ThreadPool threads(1);
    auto c = DeltaKvSequenceCache::create(p, options(), threads);
    ASSERT_TRUE(c.ok());
    Data data;
    data.chunk(**c, 40, threads);
    (*c)->truncate(20);
    EXPECT_EQ((*c)->n_tokens(), 20);
    EXPECT_EQ((*c)->compressed_tokens(), 12) << "positions 4..19 less references 4, 9, 14, 19";
    data.x.resize(20);
    data.chunk(**c, 30, threads);  // grows and compresses again from the new end
    EXPECT_EQ((*c)->n_tokens(), 50);
    EXPECT_GT((*c)->compressed_tokens(), 12);
}

// The same inputs give the same cache, with one thread or two; a decode step that rebuilds
// more tokens than one decoder block (16) covers the single-threaded pool, which hands the
// whole range over in one call.
TEST(DeltaKvCache, SameInputsSameCacheWithOneThreadOrTwo) {
    std::mt19937 rng(1);
    const DeltaKvProfile p = zero_decoder_profile(rng);
    std::vector<std::vector<float>> rows[3];
    const int n_threads[3] = {2, 2, 1};
    for (int run = 0; run < 3; ++run) {
        auto& out = rows[run];
        ThreadPool threads(n_threads[run]);
        DeltaKvOptions o = options();
        o.select_ratio = 1.0f;
        auto c = DeltaKvSequenceCache::create(p, o, threads);
        ASSERT_TRUE(c.ok());
        Data data;  // the same seed each time
        data.chunk(**c, 120, threads);
        data.chunk(**c, 1, threads);
        for (int32_t l = 0; l < kLayers; ++l) {
            const k::KvView v = (*c)->view(l, 0);
            for (int32_t e = 0; e < v.n; ++e) {
                const auto* kr = reinterpret_cast<const uint16_t*>(v.k + v.slots[e] * v.row_stride);
                out.emplace_back(kr, kr + kKvDim);
            }
        }
        EXPECT_GT((*c)->compressed_tokens(), 32);
    }
    EXPECT_EQ(rows[0], rows[1]);
    EXPECT_EQ(rows[0], rows[2]) << "one thread";
}

TEST(DeltaKvCache, ProfileThatDoesNotFitIsRejected) {
    std::mt19937 rng(1);
    DeltaKvProfile p = zero_decoder_profile(rng);
    ThreadPool threads(1);
    DeltaKvOptions o = options();
    o.n_kv_heads = 3;
    EXPECT_EQ(DeltaKvSequenceCache::create(p, o, threads).status().code(),
              StatusCode::kInvalidArgument);
    o = options();
    o.full_layer = {1, 0};
    EXPECT_EQ(DeltaKvSequenceCache::create(p, o, threads).status().code(),
              StatusCode::kInvalidArgument);
}

// Every setting out of its range is refused by name, before any memory is taken; the
// defaults (with the model's shape and a context) validate.
TEST(DeltaKvOptions, EachSettingOutOfItsRangeIsRefusedByName) {
    EXPECT_TRUE(options().validate().ok()) << options().validate().to_string();
    const std::pair<const char*, std::function<void(DeltaKvOptions&)>> bad[] = {
        {"shape", [](DeltaKvOptions& o) { o.head_dim = 7; }},
        {"rope_theta", [](DeltaKvOptions& o) { o.rope_theta = 0.0f; }},
        {"full-attention",
         [](DeltaKvOptions& o) {
             o.full_layer = {0, 0, 0};
         }},
        {"sinks", [](DeltaKvOptions& o) { o.sinks = 0; }},
        {"stride", [](DeltaKvOptions& o) { o.stride = 0; }},
        {"k (references", [](DeltaKvOptions& o) { o.k = 17; }},
        {"window", [](DeltaKvOptions& o) { o.window = 0; }},
        {"latent_bits", [](DeltaKvOptions& o) { o.latent_bits = 8; }},
        {"select_ratio", [](DeltaKvOptions& o) { o.select_ratio = 0.0f; }},
        {"select_ratio", [](DeltaKvOptions& o) { o.select_ratio = std::nanf(""); }},
        {"pin_ratio", [](DeltaKvOptions& o) { o.pin_ratio = 1.0f; }},
        {"pin_window", [](DeltaKvOptions& o) { o.pin_before = -1; }},
        {"follow", [](DeltaKvOptions& o) { o.follow = -1; }},
        {"exact_share", [](DeltaKvOptions& o) { o.exact_share = -0.1f; }},
        {"exact_depth", [](DeltaKvOptions& o) { o.exact_depth = 0.0f; }},
        {"score_every", [](DeltaKvOptions& o) { o.score_every = -1; }},
        {"score_dims", [](DeltaKvOptions& o) { o.score_dims = 1.5f; }},
        {"prefill_select", [](DeltaKvOptions& o) { o.prefill_select = -1; }},
        {"keep", [](DeltaKvOptions& o) { o.keep = 1.5f; }},
        {"logit_correction",
         [](DeltaKvOptions& o) { o.logit_correction = std::numeric_limits<float>::infinity(); }},
        {"n_ctx", [](DeltaKvOptions& o) { o.n_ctx = 0; }},
        {"65534 references", [](DeltaKvOptions& o) { o.n_ctx = 1 << 20; }},
    };
    std::mt19937 rng(1);
    const DeltaKvProfile p = zero_decoder_profile(rng);
    ThreadPool threads(1);
    for (const auto& [what, spoil] : bad) {
        DeltaKvOptions o = options();
        spoil(o);
        const Status st = o.validate();
        EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << what;
        EXPECT_NE(st.message().find(what), std::string::npos) << st.to_string();
        EXPECT_EQ(DeltaKvSequenceCache::create(p, o, threads).status().code(),
                  StatusCode::kInvalidArgument)
            << what;
    }
}

// Full layers at a keep target: the observation layer calibration measured first, then the
// most sensitive; as many as before.
TEST(DeltaKvCache, TheMeasuredObservationLayerIsTheFirstFullLayer) {
    std::mt19937 rng(1);
    DeltaKvProfile p = zero_decoder_profile(rng);
    p.sensitivity_order = {1, 0, 2};
    for (float keep : {0.3f, 0.9f}) {
        SCOPED_TRACE("keep " + std::to_string(keep));
        const DeltaKvOptions by_sensitivity = deltakv_options_for_keep(p, keep, options());
        EXPECT_EQ(by_sensitivity.full_layer[1], 1);
        p.observation_layer = 2;
        const DeltaKvOptions o = deltakv_options_for_keep(p, keep, options());
        p.observation_layer = -1;
        EXPECT_EQ(o.full_layer[2], 1);
        EXPECT_EQ(
            std::count(o.full_layer.begin(), o.full_layer.end(), 1),
            std::count(by_sensitivity.full_layer.begin(), by_sensitivity.full_layer.end(), 1));
        if (keep < 0.5f) {
            EXPECT_EQ(o.full_layer, (std::vector<uint8_t>{0, 0, 1}))
                << "one full layer: the observer";
        }
    }
}

// A keep target below what the latents can hold: the session holds about the floor
// deltakv_keep_floor tells up front, at the length it is told for.
TEST(DeltaKvCache, AKeepTargetBelowTheFloorHoldsAboutTheFloor) {
    std::mt19937 rng(1);
    const DeltaKvProfile p = zero_decoder_profile(rng);
    ThreadPool threads(2);
    DeltaKvOptions o = deltakv_options_for_keep(p, 0.05f, options());
    o.n_ctx = 1100;
    const double floor = deltakv_keep_floor(p, o, 1024);
    EXPECT_GT(floor, 0.3) << "with 8-dimensional heads a latent weighs more than the target";
    auto c = DeltaKvSequenceCache::create(p, o, threads);
    ASSERT_TRUE(c.ok());
    Data d;
    for (int32_t n = 0; n < 1024; n += 16) {
        d.chunk(**c, 16, threads);
        if (HasFatalFailure()) return;
    }
    const double ratio =
        (*c)->bytes() / static_cast<double>(full_fp16_bytes(1024, kLayers, kKvDim));
    std::printf("keep target 0.05: floor %.4f, held %.4f at 1024 tokens\n", floor, ratio);
    EXPECT_NEAR(ratio, floor, 0.01);
    EXPECT_LT(deltakv_keep_floor(p, o, 4096), floor)
        << "the sinks and buffer weigh less in a longer context";
}

// A latent names its references by 16-bit ordinals: a context with more references than
// that is refused up front, not wrapped around.
TEST(DeltaKvCache, MoreReferencesThanOrdinalsCanNameIsRefused) {
    std::mt19937 rng(1);
    DeltaKvProfile p = zero_decoder_profile(rng);
    ThreadPool threads(1);
    DeltaKvOptions o = options();  // 4 sinks, a reference every 5th token
    o.exact_share = 0.0f;
    o.n_ctx = 5 * 65530;
    EXPECT_EQ(DeltaKvSequenceCache::create(p, o, threads).status().code(),
              StatusCode::kInvalidArgument);
    o.n_ctx = 5 * 65500;
    EXPECT_TRUE(DeltaKvSequenceCache::create(p, o, threads).ok());
    // The tokens kept exact are references too: with 5% of them, a quarter of the tokens.
    o.exact_share = 0.05f;
    EXPECT_EQ(DeltaKvSequenceCache::create(p, o, threads).status().code(),
              StatusCode::kInvalidArgument);
    o.n_ctx = 4 * 65530;
    EXPECT_EQ(DeltaKvSequenceCache::create(p, o, threads).status().code(),
              StatusCode::kInvalidArgument);
    o.n_ctx = 4 * 65500;
    EXPECT_TRUE(DeltaKvSequenceCache::create(p, o, threads).ok());
}

}  // namespace
}  // namespace deltaserve::kvstore
