#include "deltaserve/model/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace deltaserve::model {
namespace {

std::vector<float> logits() { return {1.0f, 3.0f, 2.5f, -1.0f, 3.0f, 0.0f}; }

TEST(Sampler, TemperatureZeroIsGreedyWithTheFirstMaximum) {
    SamplingParams p;
    p.temperature = 0.0f;
    Sampler s(p);
    EXPECT_EQ(s.sample(logits()), 1);
    EXPECT_EQ(greedy(logits()), 1);
}

TEST(Sampler, SameSeedSameDraws) {
    SamplingParams p;
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = 42;
    Sampler a(p), b(p);
    std::vector<int32_t> da, db;
    for (int i = 0; i < 50; ++i) {
        da.push_back(a.sample(logits()));
        db.push_back(b.sample(logits()));
    }
    EXPECT_EQ(da, db);
    a.reset();
    EXPECT_EQ(a.sample(logits()), da[0]);
}

TEST(Sampler, FiltersKeepOnlyTheirCandidates) {
    SamplingParams p;
    p.temperature = 1.0f;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.top_k = 2;  // ids 1 and 4 (logit 3.0)
    Sampler s(p);
    for (int i = 0; i < 200; ++i) {
        const int32_t t = s.sample(logits());
        EXPECT_TRUE(t == 1 || t == 4) << t;
    }
    // min-p 0.5: p(2.5) / p(3.0) = e^-0.5 = 0.61 stays, p(1.0) / p(3.0) = 0.14 goes.
    p.top_k = 0;
    p.min_p = 0.5f;
    Sampler m(p);
    for (int i = 0; i < 200; ++i) {
        const int32_t t = m.sample(logits());
        EXPECT_TRUE(t == 1 || t == 2 || t == 4) << t;
    }
}

TEST(Sampler, FrequenciesFollowTheSoftmax) {
    SamplingParams p;
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = 7;
    Sampler s(p);
    const std::vector<float> two = {0.0f, std::log(3.0f)};  // probabilities 1/4 and 3/4
    int ones = 0;
    const int n = 20000;
    for (int i = 0; i < n; ++i) ones += s.sample(two) == 1;
    EXPECT_NEAR(static_cast<double>(ones) / n, 0.75, 0.02);
}

TEST(Sampler, RepetitionPenaltyDemotesSeenTokens) {
    SamplingParams p;
    p.temperature = 0.0f;
    p.repeat_penalty = 2.0f;
    Sampler s(p);
    s.accept(1);
    s.accept(4);
    EXPECT_EQ(s.sample(logits()), 2);  // 3.0 / 2 = 1.5 < 2.5
}

}  // namespace
}  // namespace deltaserve::model
