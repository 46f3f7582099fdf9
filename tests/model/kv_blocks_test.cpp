// A session's KV through stored blocks (model/kv_blocks.h, kvstore/kv_block.h): exported,
// encoded, checked and imported into a fresh context, it continues exactly as the original
// (bit-identical logits), for full KV and DeltaKV; a damaged, foreign or misordered block is
// refused and leaves the context empty. A DeltaKV block records each layer's reconstruction
// error, measured when its tokens were compressed, and keeps it through an import.
#include "deltaserve/model/kv_blocks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "default_model.h"
#include "deltaserve/common/chain_hash.h"
#include "deltaserve/kvstore/kv_block.h"
#include "deltaserve/model/sampler.h"
#include "test_paths.h"

namespace deltaserve::model {
namespace {

class KvBlocksTest : public testing::DefaultModelTest,
                     public ::testing::WithParamInterface<const char*> {
  protected:
    static std::unique_ptr<InferenceContext> context(const std::string& policy,
                                                     float exact = 0.0f) {
        ContextOptions co;
        co.n_ctx = 2048;
        co.n_threads = 2;
        co.kv.policy = policy;
        co.kv.keep = policy == "full" ? 1.0f : 0.3f;
        co.deltakv_exact = exact;
        co.kv_profile = testing::default_deltakv_profile();
        auto c = InferenceContext::create(*model_, co);
        EXPECT_TRUE(c.ok()) << c.error().to_string();
        return c.ok() ? std::move(*c) : nullptr;
    }
    static KvBlocksOptions options(const std::string& policy) {
        KvBlocksOptions o;
        o.fingerprint = hash_root(std::vector<std::string>{"SmolLM2 test", policy});
        o.root = hash_string(o.fingerprint, "session-1");
        o.block_tokens = 256;
        o.codec = policy == "full" ? kvstore::KvCodecId::kRows : kvstore::KvCodecId::kDeltaKv;
        return o;
    }
    static std::vector<std::span<const uint8_t>> views(const ExportedKvBlocks& e) {
        return {e.blocks.begin(), e.blocks.end()};
    }
    static std::vector<float> layer_errors(const std::vector<uint8_t>& block,
                                           const KvBlocksOptions& o) {
        auto v = kvstore::parse_kv_block(block, o.fingerprint);
        EXPECT_TRUE(v.ok()) << v.status().to_string();
        return v.ok() ? v->meta.layer_error : std::vector<float>();
    }
    // The mean over the layers that measured, of the first blocks' errors.
    static double mean_error(const ExportedKvBlocks& e, const KvBlocksOptions& o, size_t blocks) {
        double sum = 0.0;
        int n = 0;
        for (size_t b = 0; b < blocks; ++b) {
            for (float x : layer_errors(e.blocks[b], o)) {
                if (std::isnan(x)) continue;
                sum += x;
                ++n;
            }
        }
        return n > 0 ? sum / n : NAN;
    }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), 4 * a.size()) == 0;
}

TEST_P(KvBlocksTest, AnImportedSessionContinuesExactlyAsTheOriginal) {
    auto original = context(GetParam());
    auto restored = context(GetParam());
    ASSERT_TRUE(original && restored);
    const auto tokens = text_tokens(500);
    const std::vector<int32_t> history(tokens.begin(), tokens.begin() + 400);
    for (size_t at = 0; at < history.size(); at += 100) {  // turns; DeltaKV compresses
        ASSERT_TRUE(original->eval({history.data() + at, 100}).ok());
    }
    KvBlocksOptions o = options(GetParam());
    o.block_tokens = 100;
    auto exported = export_kv_blocks(*original, history, o);
    ASSERT_TRUE(exported.ok()) << exported.status().to_string();
    ASSERT_EQ(exported->blocks.size(), 4u);  // 400 tokens in blocks of 100
    size_t stored = 0;
    for (const auto& b : exported->blocks) stored += b.size();
    // What is stored is what the session holds, plus the headers (DeltaKV's position maps are
    // in kv_bytes but not stored).
    EXPECT_LE(stored, original->kv_bytes() + 4 * 8192) << GetParam();
    ASSERT_TRUE(import_kv_blocks(*restored, views(*exported), exported->hints, o).ok());
    ASSERT_EQ(restored->n_past(), 400);

    // Decode steps right away (they read DeltaKV's pins, which travel as the hints), then a
    // new turn's chunk and steps after it.
    int32_t t = tokens[400];
    for (int step = 0; step < 24; ++step) {
        const bool chunk = step == 12;
        auto a = chunk ? original->eval({tokens.data() + 400, 100}) : original->eval({&t, 1});
        auto b = chunk ? restored->eval({tokens.data() + 400, 100}) : restored->eval({&t, 1});
        ASSERT_TRUE(a.ok() && b.ok());
        ASSERT_EQ(std::vector<float>(a->begin(), a->end()),
                  std::vector<float>(b->begin(), b->end()))
            << GetParam() << ", step " << step;
        t = greedy(*a);
    }
}

// A store that holds a session's first blocks asks for the rest only: the same bytes, chained
// from the same keys, as the whole export's.
TEST_P(KvBlocksTest, AnExportFromABlockOnIsTheWholeExportsTail) {
    auto ctx = context(GetParam());
    ASSERT_TRUE(ctx);
    const auto history = text_tokens(300);
    ASSERT_TRUE(ctx->eval(history).ok());
    KvBlocksOptions o = options(GetParam());
    o.block_tokens = 110;
    auto whole = export_kv_blocks(*ctx, history, o);
    ASSERT_TRUE(whole.ok()) << whole.status().to_string();
    ASSERT_EQ(whole->blocks.size(), 3u);
    for (int32_t first : {1, 2, 3}) {
        o.first_block = first;
        auto tail = export_kv_blocks(*ctx, history, o);
        ASSERT_TRUE(tail.ok()) << tail.status().to_string();
        ASSERT_EQ(tail->blocks.size(), 3u - static_cast<size_t>(first));
        for (size_t i = 0; i < tail->blocks.size(); ++i)
            EXPECT_EQ(tail->blocks[i], whole->blocks[i + static_cast<size_t>(first)]) << first;
        EXPECT_EQ(tail->hints, whole->hints);
    }
}

TEST_P(KvBlocksTest, BadBlocksAreRefusedAndNothingStays) {
    auto original = context(GetParam());
    ASSERT_TRUE(original);
    const auto tokens = text_tokens(300);
    ASSERT_TRUE(original->eval(tokens).ok());
    KvBlocksOptions o = options(GetParam());
    o.block_tokens = 110;
    auto e = export_kv_blocks(*original, tokens, o);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    ASSERT_EQ(e->blocks.size(), 3u);
    auto restored = context(GetParam());
    int32_t bad = -2;

    auto flipped = *e;
    flipped.blocks[1][flipped.blocks[1].size() / 2] ^= 0x04;  // a payload byte
    Status s = import_kv_blocks(*restored, views(flipped), e->hints, o, &bad);
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.to_string();
    EXPECT_EQ(bad, 1);
    EXPECT_EQ(restored->n_past(), 0);

    KvBlocksOptions other = o;
    other.fingerprint ^= 1;  // another model or profile
    s = import_kv_blocks(*restored, views(*e), e->hints, other, &bad);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.to_string();
    EXPECT_EQ(bad, 0);

    auto swapped = *e;
    std::swap(swapped.blocks[1], swapped.blocks[2]);
    s = import_kv_blocks(*restored, views(swapped), e->hints, o, &bad);
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.to_string();
    EXPECT_EQ(bad, 1);

    KvBlocksOptions other_session = o;
    other_session.root ^= 1;  // another session's chain
    EXPECT_FALSE(import_kv_blocks(*restored, views(*e), e->hints, other_session).ok());
    EXPECT_EQ(restored->n_past(), 0);

    // After all that, the real blocks still go in.
    ASSERT_TRUE(import_kv_blocks(*restored, views(*e), e->hints, o).ok());
    EXPECT_EQ(restored->n_past(), 300);
    EXPECT_EQ(import_kv_blocks(*restored, views(*e), e->hints, o).code(),
              StatusCode::kFailedPrecondition);  // not empty
}

// What compression cost each layer of a block, as the tools show it: DeltaKV's sparse layers
// measured when their tokens were compressed, its full layers and full KV not (NaN). An
// imported session keeps the measurement: exported again, its blocks are the same bytes.
TEST_P(KvBlocksTest, EachBlockRecordsEachLayersReconstructionError) {
    auto original = context(GetParam());
    ASSERT_TRUE(original);
    // 512 tokens in turns of 128, blocks of 128: DeltaKV compresses all but its recent buffer.
    const auto tokens = text_tokens(512);
    for (size_t at = 0; at < tokens.size(); at += 128)
        ASSERT_TRUE(original->eval({tokens.data() + at, 128}).ok());
    KvBlocksOptions o = options(GetParam());
    o.block_tokens = 128;
    auto e = export_kv_blocks(*original, tokens, o);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    ASSERT_EQ(e->blocks.size(), 4u);
    const int32_t n_layers = model_->config.n_layers;
    std::vector<int32_t> measured_in(static_cast<size_t>(n_layers), 0);
    for (size_t b = 0; b < e->blocks.size(); ++b) {
        const std::vector<float> err = layer_errors(e->blocks[b], o);
        ASSERT_EQ(err.size(), static_cast<size_t>(n_layers));
        std::printf("block %zu:", b);
        for (float x : err) std::printf(" %.3f", x);
        std::printf("\n");
        for (int32_t l = 0; l < n_layers; ++l) {
            if (std::isnan(err[l])) continue;
            ++measured_in[l];
            // The compressors' relative RMS errors are a few percent to a few tens of percent
            // (0 in a block of the recent buffer, which holds no latents).
            if (b < 2) EXPECT_GT(err[l], 0.005f) << "block " << b << " layer " << l;
            EXPECT_LT(err[l], 0.7f) << "block " << b << " layer " << l;
        }
        const int32_t begin = 128 * static_cast<int32_t>(b);
        EXPECT_TRUE(same_bits(err, original->kv_rows_error(begin, begin + 128)) ||
                    GetParam() == std::string("full"));
    }
    const auto measured =
        std::count_if(measured_in.begin(), measured_in.end(), [](int32_t n) { return n > 0; });
    if (GetParam() == std::string("full")) {
        EXPECT_EQ(measured, 0);
        EXPECT_TRUE(original->kv_rows_error(0, 512).empty());
        return;
    }
    // The sparse layers measured every block; a few layers are kept full.
    EXPECT_GT(measured, n_layers / 2);
    EXPECT_LT(measured, n_layers);
    for (int32_t l = 0; l < n_layers; ++l) EXPECT_TRUE(measured_in[l] == 0 || measured_in[l] == 4);

    auto restored = context(GetParam());
    ASSERT_TRUE(import_kv_blocks(*restored, views(*e), e->hints, o).ok());
    EXPECT_TRUE(same_bits(restored->kv_rows_error(0, 512), original->kv_rows_error(0, 512)));
    auto again = export_kv_blocks(*restored, tokens, o);
    ASSERT_TRUE(again.ok()) << again.status().to_string();
    EXPECT_EQ(again->blocks, e->blocks);
}

// The measure is the real error: keeping the tokens the judging layers reconstruct worst exact
// (--kv-exact) lowers what the blocks record.
TEST_P(KvBlocksTest, TokensKeptExactLowerTheRecordedError) {
    if (GetParam() == std::string("full")) GTEST_SKIP() << "full KV compresses nothing";
    const auto tokens = text_tokens(384);
    KvBlocksOptions o = options(GetParam());
    o.block_tokens = 128;
    double mean[2] = {0.0, 0.0};
    for (int i = 0; i < 2; ++i) {
        auto ctx = context(GetParam(), i == 0 ? 0.0f : 0.25f);
        ASSERT_TRUE(ctx);
        ASSERT_TRUE(ctx->eval(tokens).ok());
        auto e = export_kv_blocks(*ctx, tokens, o);
        ASSERT_TRUE(e.ok()) << e.status().to_string();
        mean[i] = mean_error(*e, o, 2);
    }
    std::printf("mean recorded error of blocks 0-1: %.4f, with 25%% kept exact %.4f\n", mean[0],
                mean[1]);
    EXPECT_LT(mean[1], mean[0] * 0.97) << "exact 0: " << mean[0] << ", exact 0.25: " << mean[1];
}

INSTANTIATE_TEST_SUITE_P(Policies, KvBlocksTest, ::testing::Values("full", "deltakv"));

}  // namespace
}  // namespace deltaserve::model
