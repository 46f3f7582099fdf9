#include "deltaserve/model/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
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

TEST(Sampler, PresenceAndFrequencyPenalizeOnlyGeneratedTokens) {
    SamplingParams p;  // logits(): 1.0 3.0 2.5 -1.0 3.0 0.0
    p.temperature = 0.0f;
    p.presence_penalty = 0.4f;
    p.frequency_penalty = 0.2f;
    Sampler s(p);
    s.accept(1);  // the prompt's: not penalized
    EXPECT_EQ(s.sample(logits()), 1);
    s.accept_generated(1);  // 1: 3.0 - 0.2 - 0.4 = 2.4
    EXPECT_EQ(s.sample(logits()), 4);
    s.accept_generated(4);  // 4: 2.4 too; 2 at 2.5 leads
    EXPECT_EQ(s.sample(logits()), 2);
    s.accept_generated(1);  // 1: 3.0 - 0.4 - 0.4 = 2.2
    s.accept_generated(2);  // 2: 1.9
    EXPECT_EQ(s.sample(logits()), 4);
    EXPECT_EQ(s.penalized(), (std::vector<int32_t>{1, 2, 4}));
    p.presence_penalty = 2.5f;
    EXPECT_FALSE(validate_sampling(p).ok());
}

// Sampling from a row's largest logits (a device's top_k) and the penalized tokens' picks
// what sampling the whole row picks, with the same draws: over random rows with ties, every
// kind of setting, and a penalty whose tokens change as the picks are accepted.
TEST(Sampler, TheLargestLogitsAndThePenalizedPickAsTheWholeRow) {
    std::mt19937 rng(5);
    const int32_t vocab = 500;
    int compared = 0;
    for (float temperature : {0.0f, 0.7f, 1.3f}) {
        for (int32_t top_k : {0, 1, 5, 40}) {
            for (float penalty : {1.0f, 1.3f, 0.8f}) {
                for (float top_p : {1.0f, 0.9f}) {
                    SamplingParams p;
                    p.temperature = temperature;
                    p.top_k = top_k;
                    p.top_p = top_p;
                    p.min_p = top_p < 1.0f ? 0.05f : 0.0f;
                    p.repeat_penalty = penalty;
                    p.repeat_last_n = 16;
                    p.seed = rng();
                    Sampler whole(p), from_top(p);
                    for (int step = 0; step < 20; ++step) {
                        // Logits on a coarse grid: many ties, some of them at the cut.
                        std::vector<float> row(vocab);
                        for (float& l : row) l = static_cast<float>(rng() % 41) * 0.25f - 5.0f;
                        const int32_t want = from_top.candidates_wanted();
                        const int32_t expected = whole.sample(row);
                        int32_t got = 0;
                        if (want == 0) {
                            got = from_top.sample(row);
                        } else {
                            std::vector<int32_t> order(vocab);
                            std::iota(order.begin(), order.end(), 0);
                            std::stable_sort(order.begin(), order.end(),
                                             [&](int32_t a, int32_t b) { return row[a] > row[b]; });
                            std::vector<int32_t> ids(order.begin(), order.begin() + want);
                            for (int32_t id : from_top.penalized()) ids.push_back(id);
                            std::shuffle(ids.begin(), ids.end(), rng);
                            std::vector<float> values;
                            for (int32_t id : ids) values.push_back(row[id]);
                            got = from_top.sample_candidates(ids, values);
                            ++compared;
                        }
                        ASSERT_EQ(got, expected)
                            << "temperature " << temperature << ", top_k " << top_k << ", penalty "
                            << penalty << ", top_p " << top_p << ", step " << step;
                        whole.accept(expected);
                        from_top.accept(got);
                    }
                }
            }
        }
    }
    EXPECT_GT(compared, 1000);
}

TEST(Sampler, WhatTheCandidatesMustHold) {
    SamplingParams p;
    p.temperature = 0.0f;
    p.repeat_penalty = 1.5f;
    Sampler s(p);
    EXPECT_EQ(s.candidates_wanted(), 1);
    EXPECT_TRUE(s.penalized().empty());
    s.accept(7);
    s.accept(3);
    s.accept(7);
    EXPECT_EQ(s.penalized(), (std::vector<int32_t>{3, 7}));
    EXPECT_EQ(s.candidates_wanted(), 3);
    p.temperature = 0.8f;
    p.top_k = 40;
    p.repeat_penalty = 1.0f;
    EXPECT_EQ(Sampler(p).candidates_wanted(), 40);
    p.top_k = 0;
    EXPECT_EQ(Sampler(p).candidates_wanted(), 0);  // the whole row
}

}  // namespace
}  // namespace deltaserve::model
