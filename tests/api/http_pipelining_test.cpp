// Pipelined requests (RFC 9112 §9.3.2): requests sent back to back on one connection, before
// any answer, are each answered, in order: GETs, chat turns (whole and streamed) and GETs
// behind a turn, and a stream followed by more requests on the same connection.
#include "gateway_fixture.h"

namespace deltaserve::testing {
namespace {

std::string get(const std::string& path, bool last = false) {
    return "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" +
           (last ? "Connection: close\r\n" : "") + "\r\n";
}

std::string keep_alive_post(const json& body) {
    const std::string b = body.dump();
    return "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
           "Content-Type: application/json\r\nContent-Length: " +
           std::to_string(b.size()) + "\r\n\r\n" + b;
}

class HttpPipeliningTest : public HttpGatewayTest {};

TEST_F(HttpPipeliningTest, FiftyPipelinedGetsGetFiftyAnswersInOrder) {
    const uint16_t port = start({});
    std::string bytes;
    for (int i = 0; i < 50; ++i) bytes += get(i % 2 ? "/v1/models" : "/health", i == 49);
    const std::vector<HttpResponse> answers = split_responses(http_raw(port, bytes, 15000));
    ASSERT_EQ(answers.size(), 50u);
    for (size_t i = 0; i < answers.size(); ++i) {
        EXPECT_EQ(answers[i].status, 200) << i;
        EXPECT_NE(answers[i].body.find(i % 2 ? R"("object":"list")" : R"("status":"ok")"),
                  std::string::npos)
            << i << ": " << answers[i].body;
    }
}

TEST_F(HttpPipeliningTest, GetsAndChatTurnsPipelinedBehindATurnAreEachAnswered) {
    const uint16_t port = start({});
    const std::string bytes = keep_alive_post(chat("Hello", 3)) + get("/v1/models") +
                              keep_alive_post(chat("Say yes.", 2)) + get("/health") +
                              keep_alive_post(chat("Hi", 2)) + get("/health", /*last=*/true);
    const std::vector<HttpResponse> answers = split_responses(http_raw(port, bytes, 120000));
    ASSERT_EQ(answers.size(), 6u);
    for (const HttpResponse& a : answers) EXPECT_EQ(a.status, 200) << a.body;
    for (const int turn : {0, 2, 4}) {
        const json j = json::parse(answers[turn].body);
        EXPECT_EQ(j["object"], "chat.completion") << turn;
        EXPECT_EQ(j["usage"]["completion_tokens"], turn == 0 ? 3 : 2) << turn;
    }
    EXPECT_NE(answers[1].body.find(R"("object":"list")"), std::string::npos);
    EXPECT_NE(answers[3].body.find(R"("status":"ok")"), std::string::npos);
    EXPECT_NE(answers[5].body.find(R"("status":"ok")"), std::string::npos);
}

// A stream asked on a keep-alive connection ends with its last chunk, and the requests
// pipelined behind it are answered on the same connection.
TEST_F(HttpPipeliningTest, RequestsPipelinedBehindAStreamAreAnswered) {
    const uint16_t port = start({});
    const std::string bytes = keep_alive_post(chat("Hello", 3, /*stream=*/true)) +
                              get("/v1/models") + keep_alive_post(chat("Hi", 2)) +
                              get("/health", /*last=*/true);
    const std::vector<HttpResponse> answers = split_responses(http_raw(port, bytes, 120000));
    ASSERT_EQ(answers.size(), 4u);
    EXPECT_EQ(answers[0].headers.at("content-type"), "text/event-stream");
    EXPECT_NE(answers[0].body.find("data: [DONE]"), std::string::npos) << answers[0].body;
    EXPECT_NE(answers[1].body.find(R"("object":"list")"), std::string::npos);
    EXPECT_EQ(json::parse(answers[2].body)["usage"]["completion_tokens"], 2);
    EXPECT_NE(answers[3].body.find(R"("status":"ok")"), std::string::npos);
}

// Requests that arrive while a turn runs (sent after it, not with it) wait for it.
TEST_F(HttpPipeliningTest, RequestsSentDuringATurnAreAnsweredAfterIt) {
    const uint16_t port = start({});
    RawClient c(port, keep_alive_post(chat("Tell me a story about a cat.", 40)));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    c.send_more(get("/v1/models") + get("/health", /*last=*/true));
    const std::vector<HttpResponse> answers = split_responses(c.read_all(120000));
    ASSERT_EQ(answers.size(), 3u);
    EXPECT_EQ(json::parse(answers[0].body)["object"], "chat.completion");
    EXPECT_NE(answers[1].body.find(R"("object":"list")"), std::string::npos);
    EXPECT_NE(answers[2].body.find(R"("status":"ok")"), std::string::npos);
}

}  // namespace
}  // namespace deltaserve::testing
