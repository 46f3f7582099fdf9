// A model with sliding-window layers (Gemma 3 270M: 15 local layers of window 512, 3 global;
// setup fetches it) through the decode worker, past its window: the prefix cache gives a
// resent conversation its cached blocks (each layer group's, the local ones the window needs)
// and the answer is the uncached one; a prompt prefilled on a prefill node, its layers shipped
// as they are computed, answers as one prefilled here.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>

#include "decode_turns.h"
#include "deltaserve/decode/decode_worker.h"
#include "deltaserve/model/model.h"
#include "deltaserve/prefill/prefill_worker.h"
#include "deltaserve/transport/transport_factory.h"
#include "gemma_model.h"
#include "test_paths.h"

namespace deltaserve {
namespace {

using decode::TurnEnd;
using decode::TurnSpec;
using testing::CollectingSink;

class WindowModelTest : public ::testing::Test {
  protected:
    void SetUp() override {
        model_ = testing::gemma_model();
        if (model_ == nullptr) GTEST_SKIP() << testing::kGemmaAbsent;
    }
    void TearDown() override {
        prefill_.reset();
        decode_.reset();
    }
    static std::vector<int32_t> tokens(int32_t n, int32_t seed) {
        std::vector<int32_t> t = {2};  // <bos>
        for (int32_t i = 1; i < n; ++i) t.push_back(1000 + (i * 7919 + seed * 104729) % 30000);
        return t;
    }
    void start(size_t cache_bytes, int32_t local_prefill_max = 100000, bool deltakv = false) {
        decode::DecodeOptions d;
        d.context.n_ctx = 2048;
        d.context.n_threads = 2;
        d.context.n_batch = 256;
        if (deltakv) {
            d.context.kv.policy = "deltakv";
            d.context.kv.keep = 0.5f;
            d.context.kv_profile = testing::gemma_deltakv_profile();
        }
        d.threads = 2;
        d.local_prefill_max = local_prefill_max;
        d.prefix_cache_bytes = cache_bytes;
        d.model_id = "gemma";
        prefill_.reset();
        decode_.reset();
        auto dw = decode::DecodeWorker::create(*model_, d);
        ASSERT_TRUE(dw.ok()) << dw.error().to_string();
        decode_ = std::move(*dw);
        if (!transport_) transport_ = std::move(*transport::make_transport("inproc", {}));
        address_ = *decode_->listen(*transport_, "decode-" + std::to_string(++workers_));
        prefill::PrefillOptions p;
        p.context = d.context;
        p.model_id = "gemma";
        auto pw = prefill::PrefillWorker::create(*model_, p, *transport_);
        ASSERT_TRUE(pw.ok()) << pw.error().to_string();
        prefill_ = std::move(*pw);
    }
    // Runs a turn to its end (on the prefill worker too when the plan says so).
    Result<testing::TurnRun> run(const TurnSpec& spec) {
        return testing::run_turn(*decode_, *prefill_, address_, spec);
    }

    static inline model::Model* model_ = nullptr;
    std::unique_ptr<transport::Transport> transport_;
    std::unique_ptr<decode::DecodeWorker> decode_;
    std::unique_ptr<prefill::PrefillWorker> prefill_;
    std::string address_;
    int workers_ = 0;
};

TEST_F(WindowModelTest, AResentConversationPastTheWindowResumesFromTheCache) {
    const auto first = tokens(700, 1);
    auto second = first;
    const auto more = tokens(150, 2);
    second.insert(second.end(), more.begin() + 1, more.end());
    start(0);  // the answers computed whole
    auto alone = run(testing::greedy_turn(1, second, "", 12));
    ASSERT_TRUE(alone.ok()) << alone.status().to_string();
    start(size_t{64} << 20);
    auto a = run(testing::greedy_turn(2, first, "", 12));
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    auto b = run(testing::greedy_turn(3, second, "", 12));
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    EXPECT_EQ(b->end.cached_tokens, 700 / 16 * 16) << "the first prompt's whole blocks";
    EXPECT_EQ(b->end.text, alone->end.text) << "the cached prefix changed the answer";
    EXPECT_GT(decode_->stats().prefix_cache_bytes, 0);
}

TEST_F(WindowModelTest, APrefillNodeShipsPastTheWindow) {
    const auto prompt = tokens(900, 3);
    start(0);
    auto here = run(testing::greedy_turn(1, prompt, "", 12));
    ASSERT_TRUE(here.ok()) << here.status().to_string();
    EXPECT_FALSE(here->plan.remote_prefill);
    start(0, /*local_prefill_max=*/0);
    auto there = run(testing::greedy_turn(2, prompt, "", 12));
    ASSERT_TRUE(there.ok()) << there.status().to_string();
    EXPECT_TRUE(there->plan.remote_prefill);
    EXPECT_EQ(there->end.text, here->end.text);
}

// DeltaKV's compressed global layers and exact windows, shipped layer by layer as the
// prefill node computes them: the decode node answers as it does computing the prompt itself.
TEST_F(WindowModelTest, APrefillNodeShipsDeltaKvPastTheWindow) {
    if (!testing::file_exists(testing::gemma_deltakv_profile()))
        GTEST_SKIP() << testing::gemma_deltakv_profile() << " is absent (deploy/profile.sh)";
    const auto prompt = tokens(900, 4);
    start(0, 100000, true);
    auto here = run(testing::greedy_turn(1, prompt, "", 12));
    ASSERT_TRUE(here.ok()) << here.status().to_string();
    EXPECT_FALSE(here->plan.remote_prefill);
    start(0, /*local_prefill_max=*/0, true);
    auto there = run(testing::greedy_turn(2, prompt, "", 12));
    ASSERT_TRUE(there.ok()) << there.status().to_string();
    EXPECT_TRUE(there->plan.remote_prefill);
    EXPECT_EQ(there->end.text, here->end.text);
}

}  // namespace
}  // namespace deltaserve
