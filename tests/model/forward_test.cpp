// The batched forward pass: several sequences at once, and a batch that cannot fit.
#include "deltaserve/model/forward.h"

#include <gtest/gtest.h>

#include <cmath>

#include "deltaserve/model/inference_context.h"
#include "test_paths.h"

namespace deltaserve::model {
namespace {

class ForwardTest : public ::testing::Test {
  protected:
    void SetUp() override {
        DS_REQUIRE_FILE(testing::stories_model(), "stories260K");
        LoadOptions lo;
        lo.show_progress = false;
        lo.tokenizer_path = testing::stories_tokenizer();
        auto m = load_model(testing::stories_model(), lo);
        ASSERT_TRUE(m.ok()) << m.error().to_string();
        model_ = std::move(*m);
    }
    kvstore::BlockPoolOptions pool_options(int32_t blocks) const {
        return {model_->config.n_layers, model_->config.kv_dim(), model_->config.n_kv_heads,
                kernels::DType::kF32, blocks};
    }
    std::unique_ptr<Model> model_;
};

TEST_F(ForwardTest, BatchOfTwoEqualsEachAlone) {
    auto pool = kvstore::BlockPool::create(pool_options(4));
    ASSERT_TRUE(pool.ok());
    ThreadPool threads(2);
    Forward fwd(*model_, threads);
    const std::vector<int32_t> a = {1, 400, 263, 431}, b = {1, 365, 2};
    kvstore::FullSequenceCache ca(*pool), cb(*pool);
    const SequenceInput batch[] = {{&ca, a, false}, {&cb, b, false}};
    std::vector<float> both;
    ASSERT_TRUE(fwd.run(batch, both).ok());
    ASSERT_EQ(both.size(), 2u * model_->config.n_vocab);
    for (int s = 0; s < 2; ++s) {
        kvstore::FullSequenceCache alone(*pool);
        const SequenceInput one[] = {{&alone, s == 0 ? std::span<const int32_t>(a) : b, false}};
        std::vector<float> l;
        ASSERT_TRUE(fwd.run(one, l).ok());
        for (int32_t v = 0; v < model_->config.n_vocab; ++v) {
            ASSERT_NEAR(l[v], both[s * model_->config.n_vocab + v], 1e-4) << "sequence " << s;
        }
    }
    EXPECT_EQ(ca.n_tokens(), 4);
    EXPECT_EQ(cb.n_tokens(), 3);
}

TEST_F(ForwardTest, BatchThatDoesNotFitHoldsNoBlocks) {
    auto pool = kvstore::BlockPool::create(pool_options(1));
    ASSERT_TRUE(pool.ok());
    ThreadPool threads(1);
    Forward fwd(*model_, threads);
    kvstore::FullSequenceCache ca(*pool), cb(*pool);
    const std::vector<int32_t> a = {1, 400, 263}, b = {1, 365, 2};  // a block each, 1 in all
    const SequenceInput batch[] = {{&ca, a, false}, {&cb, b, false}};
    std::vector<float> logits;
    const Status st = fwd.run(batch, logits);
    EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
    EXPECT_EQ((*pool)->free_blocks(), 1);  // the first sequence's reservation was given back
    EXPECT_EQ(ca.n_tokens(), 0);
    EXPECT_EQ(cb.n_tokens(), 0);
    // An out-of-vocabulary id is refused before anything is reserved.
    const std::vector<int32_t> bad = {1, 100000};
    const SequenceInput one[] = {{&ca, bad, false}};
    EXPECT_EQ(fwd.run(one, logits).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ((*pool)->free_blocks(), 1);
}

}  // namespace
}  // namespace deltaserve::model
