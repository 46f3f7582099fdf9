// The decode worker's KV memory with DeltaKV: a prompt prefilled here stays exact until its
// last chunk, so its turn books those exact rows until the prompt is in. Apart from
// kv_memory_test.cpp because DeltaKV's prefill through ASan's instrumented kernels takes
// minutes (tests/CMakeLists.txt, DELTASERVE_SLOW_TESTS).
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <string_view>

#include "kv_memory_fixture.h"

namespace deltaserve {
namespace {

using testing::CollectingSink;
using testing::KvMemoryTest;

// Blocks in its first piece until released: what the worker has booked once the prompt is in.
class FirstPieceSink : public CollectingSink {
  public:
    bool on_piece(std::string_view piece) override {
        if (!first_) {
            first_ = true;
            in_.set_value();
            go_.get_future().wait_for(std::chrono::seconds(120));  // a failed test lets go
        }
        return CollectingSink::on_piece(piece);
    }
    std::promise<void> in_, go_;

  private:
    bool first_ = false;
};

// A DeltaKV prompt prefilled here stays exact until its last chunk (expect_more): its turn
// books that beside what its KV can grow to and gives it back once the prompt is in. The
// session's next turn books the prefill of its new tokens only.
TEST_F(KvMemoryTest, ADeltaKvPromptBooksItsExactRowsUntilItIsIn) {
    DS_REQUIRE_FILE(testing::default_deltakv_profile(), "the default model's DeltaKV profile");
    start(4096, 0, 100000, "deltakv");
    model::ContextOptions co;
    co.n_ctx = 1024;
    co.kv.policy = "deltakv";
    co.kv.keep = 0.3f;
    co.kv_profile = testing::default_deltakv_profile();
    auto probe = model::InferenceContext::create(*model_, co);
    ASSERT_TRUE(probe.ok()) << probe.error().to_string();
    const auto prompt = text_tokens(800, 0, true);
    const int32_t n = static_cast<int32_t>(prompt.size());
    const auto grows_to = static_cast<int64_t>((*probe)->kv_bytes_bound(n + 8));
    const auto exact = static_cast<int64_t>((*probe)->kv_prefill_bytes_bound(n, n));
    EXPECT_GT(exact, grows_to) << "800 tokens exact in 29 of 30 layers";
    auto sink = std::make_shared<FirstPieceSink>();
    ASSERT_TRUE(decode_->start_turn(testing::greedy_turn(1, prompt, "d", 8), sink).ok());
    EXPECT_EQ(decode_->stats().kv_booked, grows_to + exact) << "while the prompt prefills";
    ASSERT_EQ(sink->in_.get_future().wait_for(std::chrono::seconds(120)), std::future_status::ready)
        << "no piece: the prompt never got in";
    EXPECT_EQ(decode_->stats().kv_booked, grows_to) << "once the prompt is in";
    sink->go_.set_value();
    ASSERT_TRUE(sink->wait().ok());
    EXPECT_EQ(decode_->stats().kv_booked, 0);
    // The next turn of the session: its new tokens only.
    auto next = prompt;
    const auto question = text_tokens(40, 2000, true);
    next.insert(next.end(), question.begin(), question.end());
    auto sink2 = std::make_shared<FirstPieceSink>();
    ASSERT_TRUE(decode_->start_turn(testing::greedy_turn(2, next, "d", 8), sink2).ok());
    const int32_t n2 = static_cast<int32_t>(next.size());
    EXPECT_EQ(decode_->stats().kv_booked,
              static_cast<int64_t>((*probe)->kv_bytes_bound(n2 + 8) +
                                   (*probe)->kv_prefill_bytes_bound(n2, 40)));
    ASSERT_EQ(sink2->in_.get_future().wait_for(std::chrono::seconds(120)),
              std::future_status::ready);
    sink2->go_.set_value();
    ASSERT_TRUE(sink2->wait().ok());
}

}  // namespace
}  // namespace deltaserve
