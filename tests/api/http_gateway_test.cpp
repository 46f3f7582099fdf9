// The HTTP gateway under hostile and careless clients, in process, on the default model with
// a decode and a prefill worker (as `deltaserve serve` runs them): half-sent requests are cut
// at their deadline and hold no thread, the connection and queue limits answer 503 with
// Retry-After, oversized headers 431, a client that disconnects stops its turn, and stop()
// drains running turns and ends the late ones with finish_reason "shutdown".
#include <future>
#include <thread>

#include "gateway_fixture.h"

namespace deltaserve::testing {
namespace {

TEST_F(HttpGatewayTest, HalfSentRequestsHoldNoThreadAndAreCutAtTheirDeadline) {
    api::GatewayOptions o;
    o.header_timeout_ms = 300;
    o.body_timeout_ms = 300;
    const uint16_t port = start(o);
    const int threads = thread_count();
    std::vector<std::unique_ptr<RawClient>> clients;
    for (int i = 0; i < 200; ++i) {
        // Half the headers, or all headers and half the body.
        clients.push_back(std::make_unique<RawClient>(
            port, i % 2 ? "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le"
                        : "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                          "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_LE(thread_count(), threads + 2) << "no thread per connection";
    for (auto& c : clients) {
        c->read_all(3000);
        EXPECT_TRUE(c->closed_by_server());
    }
    // The gateway still answers, and counted the deadlines.
    const std::string metrics = http_raw(
        port, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", 5000);
    EXPECT_NE(metrics.find("deltaserve_http_timeouts_total 200"), std::string::npos) << metrics;
}

TEST_F(HttpGatewayTest, TheConnectionLimitAnswers503WithRetryAfter) {
    api::GatewayOptions o;
    o.max_connections = 4;
    const uint16_t port = start(o);
    std::vector<std::unique_ptr<RawClient>> idle;
    for (int i = 0; i < 4; ++i) idle.push_back(std::make_unique<RawClient>(port, ""));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const HttpResponse r = parse_http_response(http_raw(
        port, "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", 5000));
    EXPECT_EQ(r.status, 503);
    EXPECT_EQ(r.headers.count("retry-after"), 1u);
    idle.clear();  // room again
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_EQ(
        parse_http_response(
            http_raw(port, "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
                     5000))
            .status,
        200);
}

// Connections reset by their clients the moment they open (a port scan, a flood) end on
// whichever I/O thread sees them first; the gateway keeps answering.
TEST_F(HttpGatewayTest, ConnectionsResetAtOnceLeaveTheGatewayServing) {
    const uint16_t port = start({});
    std::vector<std::thread> floods;
    for (int t = 0; t < 4; ++t) {
        floods.emplace_back([port, t] {
            for (int i = 0; i < 3000; ++i) {
                const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
                sockaddr_in a{};
                a.sin_family = AF_INET;
                a.sin_port = htons(port);
                a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
                if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && (i + t) % 2) {
                    (void)!send(fd, "GET /", 5, MSG_NOSIGNAL);
                }
                const linger reset{1, 0};  // close with RST, not FIN
                setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
                close(fd);
            }
        });
    }
    for (auto& f : floods) f.join();
    const HttpResponse r = parse_http_response(http_raw(
        port, "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", 5000));
    EXPECT_EQ(r.status, 200) << "the gateway stopped answering";
    const auto until = Clock::now() + std::chrono::seconds(5);
    std::string metrics;
    while (Clock::now() < until) {
        metrics = http_raw(
            port, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", 5000);
        if (metrics.find("deltaserve_http_connections 1\n") != std::string::npos) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_NE(metrics.find("deltaserve_http_connections 1\n"), std::string::npos)
        << "only the metrics request is open:\n"
        << metrics;
}

TEST_F(HttpGatewayTest, HeadersAndSessionIdsThatBreakTheRulesGetClearErrors) {
    const uint16_t port = start({});
    HttpResponse r = parse_http_response(http_raw(
        port,
        "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + std::string(20000, 'a') + "\r\n\r\n",
        5000));
    EXPECT_EQ(r.status, 431) << r.body;
    // A long session id in a streaming request, and one with CR/LF in the body.
    r = parse_http_response(http_raw(
        port, post(chat("hi", 2, true), "X-Session-ID: " + std::string(5000, 's') + "\r\n"), 5000));
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_NE(r.body.find("X-Session-ID"), std::string::npos) << r.body;
    json body = chat("hi", 2, true);
    body["session_id"] = "a\r\nSet-Cookie: x=1";
    const std::string raw = http_raw(port, post(body), 5000);
    EXPECT_EQ(parse_http_response(raw).status, 400);
    EXPECT_EQ(raw.find("Set-Cookie"), std::string::npos) << "nothing echoed into headers";
    // A content part of the wrong type, and stream_options that is not an object.
    body = chat("hi", 2);
    body["messages"][0]["content"] = json::array({{{"type", "text"}, {"text", 7}}});
    EXPECT_EQ(parse_http_response(http_raw(port, post(body), 5000)).status, 400);
    body = chat("hi", 2, true);
    body["stream_options"] = "yes";
    EXPECT_EQ(parse_http_response(http_raw(port, post(body), 5000)).status, 400);
    // Still serving.
    r = parse_http_response(http_raw(port, post(chat("Hello", 2)), 60000));
    EXPECT_EQ(r.status, 200) << r.body;
}

TEST_F(HttpGatewayTest, PipelinedAndContinuedRequestsAreAnswered) {
    const uint16_t port = start({});
    const std::string two =
        "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: "
        "127.0.0.1\r\n"
        "Connection: close\r\n\r\n";
    const std::string out = http_raw(port, two, 5000);
    EXPECT_NE(out.find(R"({"status":"ok","store":"ok"})"), std::string::npos) << out;
    EXPECT_NE(out.find(R"("object":"list")"), std::string::npos) << out;
    // curl sends Expect: 100-continue before a larger body.
    const std::string b = chat("Hello", 2).dump();
    RawClient c(port,
                "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nExpect: 100-continue\r\n"
                "Content-Type: application/json\r\n"
                "Connection: close\r\nContent-Length: " +
                    std::to_string(b.size()) + "\r\n\r\n");
    std::string got = c.read_all(2000);
    EXPECT_EQ(got.rfind("HTTP/1.1 100 Continue\r\n\r\n", 0), 0u) << got;
}

TEST_F(HttpGatewayTest, AClientThatLeavesStopsItsTurn) {
    const uint16_t port = start({});
    for (const bool stream : {false, true}) {
        {
            RawClient c(port, post(chat("Tell me a very long story about a dragon.", 900, stream)));
            std::this_thread::sleep_for(std::chrono::milliseconds(500));
            const auto st = decode_->stats();
            ASSERT_EQ(st.running + st.waiting, 1) << "the turn runs when its client leaves";
        }  // gone: the turn ends at its next step (about 10 ms here, seconds under ASan), not
           // after 900 tokens (9 s here)
        EXPECT_TRUE(turns_end_within(2000 * time_scale()))
            << (stream ? "streaming" : "not streaming");
    }
    const HttpResponse r = parse_http_response(http_raw(port, post(chat("Hello", 2)), 60000));
    EXPECT_EQ(r.status, 200) << r.body;
}

// About 800 tokens: prefilled by the prefill worker (more than local_prefill_max), in
// a dozen chunks.
std::string long_prompt(int variant) {
    std::string s;
    for (int i = 0; i < 70; ++i) {
        s += "Sentence " + std::to_string(i + 100 * variant) + " of the long prompt goes here. ";
    }
    return s + "Summarize it.";
}

// A client that leaves while its prompt is prefilled, or waits to be, stops that prefill
// there: nothing computes for it afterwards (a prefill counts its tokens only once done).
TEST_F(HttpGatewayTest, AClientThatLeavesStopsItsPrefillQueuedOrRunning) {
    const uint16_t port = start({});
    const int64_t tokens = prefill_->stats().tokens;
    {
        RawClient running(port, post(chat(long_prompt(1), 4, true)));
        ASSERT_TRUE(prefills_within(1, 10000 * time_scale()));
        {
            RawClient queued(port, post(chat(long_prompt(2), 4)));
            ASSERT_TRUE(prefills_within(2, 10000 * time_scale()));
        }  // the second leaves the queue; the first still runs
        EXPECT_TRUE(prefills_within(1, 5000 * time_scale()));
    }
    EXPECT_TRUE(prefills_within(0, 30000 * time_scale()));
    EXPECT_TRUE(turns_end_within(5000 * time_scale()));
    const auto st = prefill_->stats();
    EXPECT_EQ(st.tokens, tokens) << "a prefill went on for a client that left";
    EXPECT_EQ(st.failures, 0) << "a cancelled prefill is no failure";
    // Serving still: a long prompt prefills to its end.
    const HttpResponse r =
        parse_http_response(http_raw(port, post(chat(long_prompt(3), 2)), 120000));
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_GT(prefill_->stats().tokens, tokens);
}

// A session's turn cancelled before it answered anything leaves the session as it was: the
// client that timed out sends the same message again and gets the answer of one turn.
TEST_F(HttpGatewayTest, ASessionTurnCancelledBeforeItsAnswerLeavesTheSessionAsItWas) {
    const uint16_t port = start({});
    const auto session = [&](const std::string& method, const std::string& path) {
        return parse_http_response(
            http_raw(port,
                     method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" +
                         "Content-Length: 0\r\n\r\n",
                     10000));
    };
    const HttpResponse opened = session("POST", "/v1/sessions");
    ASSERT_EQ(opened.status, 200) << opened.body;
    const std::string id = json::parse(opened.body)["id"];
    json body = chat(long_prompt(5), 4);
    body["session_id"] = id;
    {
        RawClient leaving(port, post(body));
        ASSERT_TRUE(prefills_within(1, 10000 * time_scale()));
    }
    EXPECT_TRUE(prefills_within(0, 30000 * time_scale()));
    EXPECT_TRUE(turns_end_within(5000 * time_scale()));
    json info;
    for (int i = 0; i < 100; ++i) {  // the turn's thread lets the session go right after
        info = json::parse(session("GET", "/v1/sessions/" + id).body);
        if (!info.value("running", true)) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_EQ(info["turns"], 0) << info;
    EXPECT_EQ(info["messages"], 0) << info;
    const HttpResponse again = parse_http_response(http_raw(port, post(body), 120000));
    ASSERT_EQ(again.status, 200) << again.body;
    EXPECT_EQ(json::parse(again.body)["usage"]["prompt_tokens"],
              json::parse(parse_http_response(http_raw(port, post(chat(long_prompt(5), 4)), 120000))
                              .body)["usage"]["prompt_tokens"])
        << "the message came once, as in a stateless request";
    info = json::parse(session("GET", "/v1/sessions/" + id).body);
    EXPECT_EQ(info["turns"], 1) << info;
    EXPECT_EQ(info["messages"], 2) << info;
}

// stop() ends a turn whose prompt is still being prefilled once the drain runs out, not when
// its first token would come.
TEST_F(HttpGatewayTest, StopEndsATurnStillPrefilling) {
    api::GatewayOptions o;
    o.drain_timeout_ms = 300;
    const uint16_t port = start(o);
    const int64_t tokens = prefill_->stats().tokens;
    auto answer = std::async(std::launch::async, [&] {
        return parse_http_response(http_raw(port, post(chat(long_prompt(4), 4)), 120000));
    });
    ASSERT_TRUE(prefills_within(1, 10000 * time_scale()));
    gateway_->stop();
    const HttpResponse r = answer.get();
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["choices"][0]["finish_reason"], "shutdown") << r.body;
    EXPECT_TRUE(prefills_within(0, 30000 * time_scale()));
    EXPECT_EQ(prefill_->stats().tokens, tokens) << "the prefill ran on after the shutdown";
}

TEST_F(HttpGatewayTest, AFullTurnQueueAnswers503WithRetryAfter) {
    api::GatewayOptions o;
    o.max_running_turns = 1;
    o.max_queued_turns = 0;
    const uint16_t port = start(o);
    RawClient busy(port, post(chat("Tell me a very long story about a dragon.", 400)));
    // Once the one turn thread holds it, the next request finds no room.
    const auto until = Clock::now() + std::chrono::seconds(10 * time_scale());
    while (Clock::now() < until && decode_->stats().running + decode_->stats().waiting == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    const HttpResponse r = parse_http_response(http_raw(port, post(chat("Hi", 2)), 5000));
    EXPECT_EQ(r.status, 503) << r.body;
    EXPECT_EQ(r.headers.count("retry-after"), 1u);
}

TEST_F(HttpGatewayTest, StopDrainsAndEndsLateTurnsWithShutdown) {
    api::GatewayOptions o;
    o.drain_timeout_ms = 300;
    const uint16_t port = start(o);
    auto answer = std::async(std::launch::async, [&] {
        return parse_http_response(
            http_raw(port, post(chat("Tell me a very long story about a dragon.", 900)), 60000));
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const auto t0 = Clock::now();
    gateway_->stop();
    EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5 * time_scale()));
    const HttpResponse r = answer.get();
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["choices"][0]["finish_reason"], "shutdown") << r.body;
    EXPECT_TRUE(turns_end_within(3000 * time_scale()));
    // Nothing listens any more.
    EXPECT_EQ(http_raw(port, "GET /health HTTP/1.1\r\n\r\n", 1000), "");
}

}  // namespace
}  // namespace deltaserve::testing
