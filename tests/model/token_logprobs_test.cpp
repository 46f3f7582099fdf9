// A token's log-probabilities from a row of logits, and their encoding between nodes: the
// values of a log-softmax, the top tokens in order (ties to the lower id), and hostile
// bytes refused.
#include "deltaserve/model/token_logprobs.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace deltaserve::model {
namespace {

TEST(TokenLogprobs, ALogSoftmaxAndItsLargest) {
    const std::vector<float> logits = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f};
    double z = 0;
    for (float x : logits) z += std::exp(x);
    const TokenLogprobs lp = token_logprobs(logits, 4, 3);
    EXPECT_EQ(lp.chosen.token, 4);
    EXPECT_NEAR(lp.chosen.logprob, 0.5 - std::log(z), 1e-6);
    ASSERT_EQ(lp.top.size(), 3u);
    EXPECT_EQ(lp.top[0].token, 1);  // a tie: the lower id first
    EXPECT_EQ(lp.top[1].token, 3);
    EXPECT_EQ(lp.top[2].token, 0);
    EXPECT_NEAR(lp.top[2].logprob, 1.0 - std::log(z), 1e-6);
    EXPECT_TRUE(token_logprobs(logits, 1, 0).top.empty());
    EXPECT_EQ(token_logprobs(logits, 1, 99).top.size(), logits.size());  // at most the row
}

TEST(TokenLogprobs, LargeLogitsDoNotOverflow) {
    std::vector<float> logits(1000, 80.0f);
    logits[7] = 200.0f;
    const TokenLogprobs lp = token_logprobs(logits, 7, 2);
    EXPECT_TRUE(std::isfinite(lp.chosen.logprob));
    EXPECT_LE(lp.chosen.logprob, 0.0f);
    EXPECT_NEAR(lp.chosen.logprob, 0.0, 1e-6);
    EXPECT_EQ(lp.top[1].token, 0);
}

TEST(TokenLogprobs, EncodingRoundTripsAndRefusesHostileBytes) {
    std::vector<float> logits(64);
    for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(static_cast<float>(i));
    const TokenLogprobs lp = token_logprobs(logits, 9, kMaxTopLogprobs);
    const std::string bytes = encode_token_logprobs(lp);
    EXPECT_LE(bytes.size(), 172u);
    auto back = decode_token_logprobs(bytes, 64);
    ASSERT_TRUE(back.ok()) << back.error().to_string();
    EXPECT_EQ(back->chosen.token, 9);
    EXPECT_EQ(back->chosen.logprob, lp.chosen.logprob);
    ASSERT_EQ(back->top.size(), lp.top.size());
    for (size_t i = 0; i < lp.top.size(); ++i) EXPECT_EQ(back->top[i].token, lp.top[i].token);

    EXPECT_FALSE(decode_token_logprobs(bytes, 9).ok());  // a token outside the vocabulary
    EXPECT_FALSE(decode_token_logprobs(bytes.substr(0, bytes.size() - 1), 64).ok());
    EXPECT_FALSE(decode_token_logprobs("", 64).ok());
    std::string many = bytes;
    many[0] = 21;  // more top tokens than allowed
    EXPECT_FALSE(decode_token_logprobs(many, 64).ok());
    TokenLogprobs bad = lp;
    bad.chosen.logprob = 0.5f;  // a probability above 1
    EXPECT_FALSE(decode_token_logprobs(encode_token_logprobs(bad), 64).ok());
    bad.chosen.logprob = std::nanf("");
    EXPECT_FALSE(check_token_logprobs(bad, 64).ok());
}

}  // namespace
}  // namespace deltaserve::model
