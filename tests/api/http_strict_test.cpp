// Strict HTTP at the gateway: bodies that name a JSON key twice, Transfer-Encodings other than
// chunked, bodies over the limit (announced or sent), absolute-form targets, 405 with Allow,
// HEAD wherever GET is, one Authorization header with the Bearer scheme in any case, and the
// framing attacks (CL+TE, bad chunks, NUL, obs-fold, HTTP/0.9 and HTTP/2 prefaces) refused.
#include "gateway_fixture.h"

namespace deltaserve::testing {
namespace {

// A request with `body` (given as raw JSON text) and these extra header lines.
std::string raw_post(const std::string& path, const std::string& body,
                     const std::string& headers = "") {
    return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" +
           "Content-Type: application/json\r\n" + headers +
           "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

std::string request(const std::string& method, const std::string& target,
                    const std::string& headers = "") {
    return method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" +
           headers + "\r\n";
}

class HttpStrictTest : public HttpGatewayTest {};

TEST_F(HttpStrictTest, AJsonKeyNamedTwiceIsRefusedByName) {
    const uint16_t port = start({});
    const std::string messages = R"("messages": [{"role": "user", "content": "Hi"}])";
    HttpResponse r = parse_http_response(
        http_raw(port,
                 raw_post("/v1/chat/completions",
                          "{" + messages + R"(, "max_tokens": 2, "max_tokens": 900})"),
                 10000));
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_NE(r.body.find("'max_tokens' twice"), std::string::npos) << r.body;
    // In a nested object: the role of a message.
    r = parse_http_response(
        http_raw(port,
                 raw_post("/v1/chat/completions",
                          R"({"messages": [{"role": "user", "role": "system", "content": "Hi"}]})"),
                 10000));
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_NE(r.body.find("'role' twice"), std::string::npos) << r.body;
    // The same key in two objects is no duplicate.
    r = parse_http_response(http_raw(
        port,
        raw_post(
            "/v1/chat/completions",
            R"({"messages": [{"role": "user", "content": "Hi"}, )"
            R"({"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"}],)"
            R"( "max_tokens": 2})"),
        60000));
    EXPECT_EQ(r.status, 200) << r.body;
    // A session's body.
    r = parse_http_response(
        http_raw(port, raw_post("/v1/sessions", R"({"id": "a", "id": "b"})"), 10000));
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_NE(r.body.find("'id' twice"), std::string::npos) << r.body;
}

TEST_F(HttpStrictTest, ATransferEncodingOtherThanChunkedAloneIs501) {
    const uint16_t port = start({});
    const std::string body = chat("Hi", 2).dump();
    char size[16];
    std::snprintf(size, sizeof size, "%zx", body.size());
    const std::string chunked = std::string(size) + "\r\n" + body + "\r\n0\r\n\r\n";
    const std::string head =
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        "Content-Type: application/json\r\n";
    for (const std::string te : {"gzip, chunked", "gzip", "chunked, chunked", "identity"}) {
        const HttpResponse r = parse_http_response(
            http_raw(port, head + "Transfer-Encoding: " + te + "\r\n\r\n" + chunked, 10000));
        EXPECT_EQ(r.status, 501) << te << r.body;
    }
    // Two headers: the parser refuses them itself.
    HttpResponse r = parse_http_response(http_raw(
        port, head + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked,
        10000));
    EXPECT_EQ(r.status, 400) << r.body;
    r = parse_http_response(
        http_raw(port, head + "Transfer-Encoding: chunked\r\n\r\n" + chunked, 60000));
    EXPECT_EQ(r.status, 200) << r.body;
}

TEST_F(HttpStrictTest, ABodyOverTheLimitIs413AnnouncedOrSent) {
    api::GatewayOptions o;
    o.max_body_bytes = 4096;
    const uint16_t port = start(o);
    // Announced: answered from the head, before any of the body is sent.
    RawClient announced(port,
                        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                        "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n");
    HttpResponse r = parse_http_response(announced.read_all(5000));
    EXPECT_EQ(r.status, 413) << r.body;
    // Sent in chunks.
    std::string chunks;
    for (int i = 0; i < 8; ++i) chunks += "400\r\n" + std::string(1024, ' ') + "\r\n";
    r = parse_http_response(
        http_raw(port,
                 "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                 "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" +
                     chunks + "0\r\n\r\n",
                 5000));
    EXPECT_EQ(r.status, 413) << r.body;
}

TEST_F(HttpStrictTest, AbsoluteFormTargetsAreServed) {
    const uint16_t port = start({});
    const std::string authority = "http://127.0.0.1:" + std::to_string(port);
    HttpResponse r =
        parse_http_response(http_raw(port, request("GET", authority + "/health"), 5000));
    EXPECT_EQ(r.status, 200) << r.body;
    r = parse_http_response(
        http_raw(port, raw_post(authority + "/v1/chat/completions", chat("Hi", 2).dump()), 60000));
    EXPECT_EQ(r.status, 200) << r.body;
    // Its authority stands for Host, and is checked as Host is.
    r = parse_http_response(
        http_raw(port, request("GET", "http://attacker.example:8000/health"), 5000));
    EXPECT_EQ(r.status, 403) << r.body;
}

TEST_F(HttpStrictTest, Every405NamesTheAllowedMethods) {
    const uint16_t port = start({});
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"GET /v1/chat/completions", "POST"},
        {"DELETE /health", "GET, HEAD"},
        {"POST /v1/models", "GET, HEAD"},
        {"PUT /v1/sessions", "GET, HEAD, POST"},
        {"POST /v1/sessions/abc", "GET, HEAD, DELETE"},
        {"HEAD /v1/chat/completions", "POST"}};
    for (const auto& [line, allow] : cases) {
        const size_t space = line.find(' ');
        HttpResponse r = parse_http_response(http_raw(
            port, request(line.substr(0, space), line.substr(space + 1), "Content-Length: 0\r\n"),
            5000));
        EXPECT_EQ(r.status, 405) << line;
        EXPECT_EQ(r.headers["allow"], allow) << line;
    }
}

TEST_F(HttpStrictTest, HeadIsAnsweredWhereverGetIsWithoutABody) {
    const uint16_t port = start({});
    for (const std::string path : {"/health", "/v1/models", "/metrics", "/v1/sessions"}) {
        HttpResponse get = parse_http_response(http_raw(port, request("GET", path), 5000));
        ASSERT_EQ(get.status, 200) << path;
        // HEAD then GET on one connection: the GET's answer starts right after the HEAD's head.
        const std::string raw = http_raw(
            port, "HEAD " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" + request("GET", path),
            5000);
        const size_t head_end = raw.find("\r\n\r\n");
        ASSERT_NE(head_end, std::string::npos) << raw;
        HttpResponse head = parse_http_response(raw.substr(0, head_end + 4));
        EXPECT_EQ(head.status, 200) << path;
        EXPECT_EQ(head.headers["content-type"], get.headers["content-type"]) << path;
        if (path != "/metrics") {  // the metrics change between two calls
            EXPECT_EQ(head.headers["content-length"], get.headers["content-length"]) << path;
        }
        EXPECT_EQ(raw.compare(head_end + 4, 9, "HTTP/1.1 "), 0) << "a body after HEAD: " << raw;
    }
}

TEST_F(HttpStrictTest, AuthorizationIsOneBearerHeaderWithTheSchemeInAnyCase) {
    api::GatewayOptions o;
    o.access.api_keys = {"key-one"};
    const uint16_t port = start(o);
    for (const std::string scheme : {"Bearer", "bearer", "BEARER", "bEaReR"}) {
        const HttpResponse r = parse_http_response(http_raw(
            port, request("GET", "/v1/models", "Authorization: " + scheme + " key-one\r\n"), 5000));
        EXPECT_EQ(r.status, 200) << scheme << r.body;
    }
    HttpResponse r = parse_http_response(
        http_raw(port,
                 request("GET", "/v1/models",
                         "Authorization: Bearer key-one\r\nAuthorization: Bearer key-one\r\n"),
                 5000));
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_NE(r.body.find("more than one Authorization"), std::string::npos) << r.body;
    r = parse_http_response(http_raw(
        port, request("GET", "/v1/models", "Authorization: Basic a2V5LW9uZQ==\r\n"), 5000));
    EXPECT_EQ(r.status, 401) << r.body;
    EXPECT_NE(r.body.find("Bearer KEY"), std::string::npos) << r.body;
    for (const std::string wrong :
         {"Bearer key-on", "Bearer key-one2", "Bearerkey-one", "Bearer "}) {
        r = parse_http_response(
            http_raw(port, request("GET", "/v1/models", "Authorization: " + wrong + "\r\n"), 5000));
        EXPECT_EQ(r.status, 401) << wrong;
    }
}

TEST_F(HttpStrictTest, FramingAttacksAreRefusedAndNoTurnRuns) {
    const uint16_t port = start({});
    const std::string body = chat("Hi", 2).dump();
    const std::string head =
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        "Content-Type: application/json\r\n";
    const std::vector<std::string> attacks = {
        head + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        head + "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
        head + "Transfer-Encoding: chunked\r\n\r\nzz\r\n" + body + "\r\n0\r\n\r\n",
        head + "Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
        head + std::string("X-A: a\0b\r\n", 10) + "Content-Length: 2\r\n\r\n{}",
        head + "X-A: a\r\n folded\r\nContent-Length: 2\r\n\r\n{}",
        "GET /health\r\n\r\n",
        "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    };
    for (size_t i = 0; i < attacks.size(); ++i) {
        const std::string raw = http_raw(port, attacks[i], 5000);
        const HttpResponse r = parse_http_response(raw);
        EXPECT_TRUE(r.status == 0 || (r.status >= 400 && r.status < 500)) << i << ": " << raw;
    }
    EXPECT_EQ(decode_->stats().turns, 0) << "a smuggled request ran";
    const HttpResponse r = parse_http_response(http_raw(port, request("GET", "/health"), 5000));
    EXPECT_EQ(r.status, 200);
}

}  // namespace
}  // namespace deltaserve::testing
