// The gateway under more turns than it runs: a request that finds the turn queue full gets
// 503 with Retry-After at once, a queued one waits at most the queue timeout for a turn
// thread before the same answer, and a streaming client that stops reading is dropped at
// the write deadline (its socket's send buffer is small, so the kernel does not take the
// stream for it), which ends its turn and frees its turn thread.
#include "gateway_fixture.h"

namespace deltaserve::testing {
namespace {

class HttpOverloadTest : public HttpGatewayTest {
  protected:
    // Waits for `n` turns to run or wait on the decode worker; false after timeout_ms.
    bool turns_within(int64_t n, int timeout_ms) {
        const auto until = Clock::now() + std::chrono::milliseconds(timeout_ms);
        while (Clock::now() < until) {
            const auto s = decode_->stats();
            if (s.running + s.waiting == n) return true;
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        return false;
    }
};

const char* kLongStory = "Tell me a very long story about a dragon.";

TEST_F(HttpOverloadTest, AQueuedRequestGets503WithRetryAfterAtTheQueueTimeout) {
    api::GatewayOptions o;
    o.max_running_turns = 1;
    o.max_queued_turns = 1;
    o.queue_timeout_ms = 500;
    const uint16_t port = start(o);
    RawClient busy(port, post(chat(kLongStory, 900)));  // about 9 s of the one turn thread
    ASSERT_TRUE(turns_within(1, 10000 * time_scale()));
    // Queued behind it: answered at the queue timeout, long before the turn ahead ends.
    auto queued = std::async(std::launch::async, [&] {
        return parse_http_response(http_raw(port, post(chat("Hi", 2)), 4000));
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    // The queue is full now: refused at once.
    const HttpResponse refused = parse_http_response(http_raw(port, post(chat("Hi", 2)), 2000));
    EXPECT_EQ(refused.status, 503) << refused.body;
    EXPECT_EQ(refused.headers.count("retry-after"), 1u);
    const HttpResponse r = queued.get();
    EXPECT_EQ(r.status, 503) << r.body;
    EXPECT_EQ(r.headers.count("retry-after"), 1u);
    EXPECT_NE(r.body.find("500 ms"), std::string::npos) << r.body;
    EXPECT_EQ(decode_->stats().running + decode_->stats().waiting, 1) << "it never ran";
}

// The tester's case, scaled: every turn thread streams to a client that never reads, and
// more wait. The readers are dropped at the write deadline, which frees their threads: the
// next request is served.
TEST_F(HttpOverloadTest, StreamingClientsThatStopReadingAreDroppedAndTheirThreadsFreed) {
    api::GatewayOptions o;
    o.max_running_turns = 2;
    o.max_queued_turns = 0;
    o.write_timeout_ms = 1000;
    const uint16_t port = start(o);
    std::vector<std::unique_ptr<RawClient>> stalled;
    for (int i = 0; i < 2; ++i) {
        stalled.push_back(std::make_unique<RawClient>(
            port, post(chat(kLongStory, 900, /*stream=*/true)), /*receive_buffer=*/4096));
    }
    ASSERT_TRUE(turns_within(2, 10000 * time_scale()));
    const HttpResponse refused = parse_http_response(http_raw(port, post(chat("Hi", 2)), 2000));
    EXPECT_EQ(refused.status, 503) << refused.body;
    EXPECT_EQ(refused.headers.count("retry-after"), 1u);
    // Dropped: the turns end without their clients reading a byte (900 tokens take 9 s).
    EXPECT_TRUE(turns_end_within(30000 * time_scale()));
    for (auto& c : stalled) {
        const std::string got = c->read_all(5000);
        EXPECT_TRUE(c->closed_by_server());
        EXPECT_EQ(got.find("data: [DONE]"), std::string::npos)
            << "the stream ran to its end into kernel buffers (" << got.size() << " bytes)";
    }
    const HttpResponse r = parse_http_response(http_raw(port, post(chat("Hello", 2)), 60000));
    EXPECT_EQ(r.status, 200) << r.body;
    const std::string metrics = http_raw(
        port, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", 5000);
    EXPECT_NE(metrics.find("deltaserve_http_timeouts_total 2"), std::string::npos) << metrics;
}

}  // namespace
}  // namespace deltaserve::testing
