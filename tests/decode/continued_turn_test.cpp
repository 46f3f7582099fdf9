// A turn continued from its prompt and its answer so far (TurnSpec::continued), as the
// gateway moves a turn whose node was lost, on a worker with no prefix cache (it computes the
// prompt again, as another node does): the continuation's tokens and text are the
// uninterrupted turn's, greedy and sampled (penalties too), with a stop string, and with
// eight continued at once; bad continuations are refused.
#include <gtest/gtest.h>

#include "kv_memory_fixture.h"

namespace deltaserve {
namespace {

// Each generated token and the bytes of text the sink had when the next token came.
class RecordingSink : public decode::TurnSink {
  public:
    void on_token(int32_t token) override {
        sent_at.push_back(static_cast<int32_t>(text.size()));  // before this token
        tokens.push_back(token);
    }
    bool on_piece(std::string_view piece) override {
        text += piece;
        return true;
    }
    void on_end(Result<decode::TurnEnd> e) override { done.set_value(std::move(e)); }
    Result<decode::TurnEnd> wait() {
        auto f = done.get_future();
        if (f.wait_for(std::chrono::seconds(120)) != std::future_status::ready)
            return deadline_exceeded("the turn did not end");
        return f.get();
    }
    // Bytes of text sent once k tokens were reported (before the next one came).
    int32_t sent_after(size_t k) const {
        return k < sent_at.size() ? sent_at[k] : static_cast<int32_t>(text.size());
    }

    std::vector<int32_t> tokens;
    std::vector<int32_t> sent_at;
    std::string text;
    std::promise<Result<decode::TurnEnd>> done;
};

class ContinuedTurnTest : public testing::KvMemoryTest {
  protected:
    void SetUp() override {
        testing::KvMemoryTest::SetUp();
        if (IsSkipped()) return;
        decode::DecodeOptions d;
        d.context.n_ctx = 2048;
        d.context.n_batch = 512;
        d.context.n_threads = 1;
        d.threads = 1;
        d.prefill_chunk = 128;
        // No prefix cache: a continuation computes its prompt again, as another node does.
        d.prefix_cache_bytes = 0;
        d.kv_memory = block() * 256;
        d.local_prefill_max = 100000;
        d.model_id = "m";
        auto dw = decode::DecodeWorker::create(*model_, d);
        ASSERT_TRUE(dw.ok()) << dw.error().to_string();
        decode_ = std::move(*dw);
        auto ids = model_->tokenizer->encode(
            "<|im_start|>user\nTell me about the sea and its ships.<|im_end|>\n"
            "<|im_start|>assistant\n",
            false, true);
        ASSERT_TRUE(ids.ok());
        prompt_ = *ids;
    }
    struct Run {
        decode::TurnEnd end;
        std::vector<int32_t> tokens;
        std::vector<int32_t> sent_at;
        std::string text;  // as streamed
    };
    Result<Run> run(const decode::TurnSpec& spec) {
        auto sink = std::make_shared<RecordingSink>();
        auto plan = decode_->start_turn(spec, sink);
        if (!plan.ok()) return plan.status();
        auto end = sink->wait();
        if (!end.ok()) return end.status();
        return Run{*end, sink->tokens, sink->sent_at, sink->text};
    }
    decode::TurnSpec spec(uint64_t id, float temperature) const {
        decode::TurnSpec t = testing::greedy_turn(id, prompt_, "", 48);
        t.sampling.temperature = temperature;
        t.sampling.seed = 17;
        return t;
    }
    // The turn again from its first k tokens: what it streams, and how it ends.
    Result<Run> continued(decode::TurnSpec t, const Run& whole, size_t k) {
        t.turn_id += 1000 + k;
        t.tokens.insert(t.tokens.end(), whole.tokens.begin(),
                        whole.tokens.begin() + static_cast<std::ptrdiff_t>(k));
        t.continued = static_cast<int32_t>(k);
        t.continued_sent =
            k < whole.sent_at.size() ? whole.sent_at[k] : static_cast<int32_t>(whole.text.size());
        return run(t);
    }
    void expect_same_answer(const decode::TurnSpec& t) {
        auto whole = run(t);
        ASSERT_TRUE(whole.ok()) << whole.status().to_string();
        const size_t n = whole->tokens.size();
        ASSERT_GE(n, 8u);
        for (size_t k : {size_t{1}, size_t{7}, n / 2, n - 1}) {
            auto c = continued(t, *whole, k);
            ASSERT_TRUE(c.ok()) << c.status().to_string();
            const size_t sent = static_cast<size_t>(whole->sent_at[k]);
            EXPECT_EQ(whole->text.substr(0, sent) + c->text, whole->text) << "k " << k;
            EXPECT_EQ(c->end.text, whole->end.text) << "k " << k;
            EXPECT_EQ(c->end.finish_reason, whole->end.finish_reason) << "k " << k;
            EXPECT_EQ(c->end.completion_tokens, whole->end.completion_tokens) << "k " << k;
            EXPECT_EQ(std::vector<int32_t>(whole->tokens.begin() + static_cast<std::ptrdiff_t>(k),
                                           whole->tokens.end()),
                      c->tokens)
                << "k " << k;
        }
    }

    std::vector<int32_t> prompt_;
};

TEST_F(ContinuedTurnTest, AGreedyTurnGoesOnAsIfItHadNotStopped) { expect_same_answer(spec(1, 0)); }

TEST_F(ContinuedTurnTest, ASampledTurnGoesOnFromTheSameRandomState) {
    expect_same_answer(spec(2, 0.9f));
    // With penalties on the answer's tokens too: they count the continued ones.
    decode::TurnSpec t = spec(3, 0.9f);
    t.sampling.presence_penalty = 1.0f;
    t.sampling.frequency_penalty = 0.5f;
    expect_same_answer(t);
}

TEST_F(ContinuedTurnTest, AStopStringAcrossTheMoveEndsItWhereItWould) {
    auto whole = run(spec(4, 0));
    ASSERT_TRUE(whole.ok());
    // A word from the answer's second half as the stop string.
    const std::string& text = whole->end.text;
    const size_t at = text.find(' ', text.size() / 2);
    ASSERT_NE(at, std::string::npos);
    // Long enough to come first there, so the stop cuts the answer in its second half.
    size_t len = 4;
    while (text.find(text.substr(at, len)) < at && at + len < text.size()) ++len;
    decode::TurnSpec t = spec(5, 0);
    t.stop = {text.substr(at, len)};
    expect_same_answer(t);
    auto stopped = run(t);
    ASSERT_TRUE(stopped.ok());
    EXPECT_EQ(stopped->end.finish_reason, "stop");
}

TEST_F(ContinuedTurnTest, ContinuationsThatCannotBeAreRefused) {
    decode::TurnSpec t = spec(6, 0);
    t.continued = static_cast<int32_t>(t.tokens.size());
    EXPECT_EQ(decode_->start_turn(t, std::make_shared<RecordingSink>()).status().code(),
              StatusCode::kInvalidArgument);
    t.continued = -1;
    EXPECT_FALSE(decode_->start_turn(t, std::make_shared<RecordingSink>()).ok());
    t.continued = 2;
    t.continued_sent = -1;
    EXPECT_FALSE(decode_->start_turn(t, std::make_shared<RecordingSink>()).ok());
    t.continued_sent = 0;
    t.prompt_logprobs = 0;
    EXPECT_FALSE(decode_->start_turn(t, std::make_shared<RecordingSink>()).ok());
    t.prompt_logprobs = -1;
    t.max_tokens = 2;
    EXPECT_FALSE(decode_->start_turn(t, std::make_shared<RecordingSink>()).ok());
}

}  // namespace
}  // namespace deltaserve

namespace deltaserve {
namespace {

TEST_F(ContinuedTurnTest, ContinuedTurnsBatchedTogetherAreEachTheUninterruptedOne) {
    decode::TurnSpec t = spec(7, 0);
    t.max_tokens = 200;
    auto whole = run(t);
    ASSERT_TRUE(whole.ok());
    ASSERT_GT(whole->tokens.size(), 150u);
    std::vector<std::shared_ptr<RecordingSink>> sinks;
    std::vector<size_t> ks;
    for (int i = 0; i < 8; ++i) {
        const size_t k = 120 + static_cast<size_t>(i % 3);
        decode::TurnSpec c = t;
        c.turn_id = 100 + static_cast<uint64_t>(i);
        c.tokens.insert(c.tokens.end(), whole->tokens.begin(),
                        whole->tokens.begin() + static_cast<std::ptrdiff_t>(k));
        c.continued = static_cast<int32_t>(k);
        c.continued_sent = whole->sent_at[k];
        auto sink = std::make_shared<RecordingSink>();
        ASSERT_TRUE(decode_->start_turn(c, sink).ok());
        sinks.push_back(sink);
        ks.push_back(k);
    }
    for (size_t i = 0; i < sinks.size(); ++i) {
        auto end = sinks[i]->wait();
        ASSERT_TRUE(end.ok());
        EXPECT_EQ(end->text, whole->end.text) << "turn " << i << " from token " << ks[i];
    }
}

}  // namespace
}  // namespace deltaserve
