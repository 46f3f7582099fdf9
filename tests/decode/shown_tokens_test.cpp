// Control tokens in an answer's text (decode::TurnSpec::shown_tokens), on the default model:
// a control token the turn names is written as its text, the rest stay out of it as before,
// and a turn naming tokens outside the vocabulary, or too many, is refused.
#include <gtest/gtest.h>

#include "kv_memory_fixture.h"

namespace deltaserve {
namespace {

using testing::KvMemoryTest;

class ShownTokensTest : public KvMemoryTest {
  protected:
    // A ChatML conversation whose user turn has just ended: the model's next token is the
    // control token that opens the assistant's turn.
    std::vector<int32_t> after_a_turn() {
        auto ids = model_->tokenizer->encode(
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
            "Hello<|im_end|>\n",
            /*add_bos=*/false, /*parse_special=*/true);
        EXPECT_TRUE(ids.ok());
        return ids.ok() ? *ids : std::vector<int32_t>{};
    }
    int32_t im_start() const {
        const auto& toks = model_->tokenizer->vocab().tokens;
        for (size_t i = 0; i < toks.size(); ++i)
            if (toks[i] == "<|im_start|>") return static_cast<int32_t>(i);
        return -1;
    }
};

TEST_F(ShownTokensTest, ANamedControlTokenIsWrittenAndOthersAreNot) {
    start(256);
    const int32_t open = im_start();
    ASSERT_GE(open, 0);
    auto hidden = run(testing::greedy_turn(1, after_a_turn(), "", 4));
    ASSERT_TRUE(hidden.ok()) << hidden.status().to_string();
    auto spec = testing::greedy_turn(2, after_a_turn(), "", 4);
    spec.shown_tokens = {open};
    auto shown = run(spec);
    ASSERT_TRUE(shown.ok()) << shown.status().to_string();
    // The same tokens, greedy; only the first one's text differs.
    ASSERT_EQ(shown->text.rfind("<|im_start|>", 0), 0u) << shown->text << " / " << hidden->text;
    EXPECT_EQ(shown->text.substr(std::string("<|im_start|>").size()), hidden->text);
    EXPECT_EQ(hidden->text.find("<|im_start|>"), std::string::npos);
    EXPECT_EQ(shown->completion_tokens, hidden->completion_tokens);
}

TEST_F(ShownTokensTest, BadShownTokensAreRefused) {
    start(64);
    auto spec = testing::greedy_turn(1, after_a_turn(), "", 4);
    spec.shown_tokens = {model_->config.n_vocab};
    auto sink = std::make_shared<testing::CollectingSink>();
    EXPECT_EQ(decode_->start_turn(spec, sink).status().code(), StatusCode::kInvalidArgument);
    spec.shown_tokens = {-1};
    EXPECT_EQ(decode_->start_turn(spec, sink).status().code(), StatusCode::kInvalidArgument);
    spec.shown_tokens.assign(17, 1);
    EXPECT_EQ(decode_->start_turn(spec, sink).status().code(), StatusCode::kInvalidArgument);
    // Nothing was held for them: a good turn still runs.
    spec.shown_tokens = {};
    EXPECT_TRUE(run(spec).ok());
}

}  // namespace
}  // namespace deltaserve
