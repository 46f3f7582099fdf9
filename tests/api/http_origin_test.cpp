// The gateway against web pages (DNS rebinding, browser CSRF; Ollama's CVE-2024-28224):
// without an API key it answers only Host values naming its loopback address (or given with
// allowed_hosts), refuses bodies that are not JSON (a page's "simple" text/plain post needs no
// preflight), answers CORS preflights only for allowed origins, and refuses requests that
// carry an Origin not allowed. A missing Host on HTTP/1.1 is a 400 (RFC 9112 §3.2).
#include "gateway_fixture.h"

namespace deltaserve::testing {
namespace {

HttpResponse get_with(uint16_t port, const std::string& path, const std::string& headers,
                      const std::string& version = "HTTP/1.1") {
    return parse_http_response(http_raw(
        port, "GET " + path + " " + version + "\r\nConnection: close\r\n" + headers + "\r\n",
        5000));
}

HttpResponse post_with(uint16_t port, const std::string& headers, const std::string& body) {
    return parse_http_response(
        http_raw(port,
                 "POST /v1/chat/completions HTTP/1.1\r\nConnection: close\r\n" + headers +
                     "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body,
                 60000));
}

class HttpOriginTest : public HttpGatewayTest {};

TEST_F(HttpOriginTest, WithoutAKeyOnlyLoopbackHostsAreAnswered) {
    const uint16_t port = start({});
    const std::string p = std::to_string(port);
    for (const std::string& host :
         std::vector<std::string>{"127.0.0.1:" + p, "localhost:" + p, "LocalHost:" + p,
                                  "[::1]:" + p, "127.0.0.1", "localhost"}) {
        EXPECT_EQ(get_with(port, "/v1/models", "Host: " + host + "\r\n").status, 200) << host;
    }
    // A rebinding page's own name, another port, names that only start like ours.
    for (const std::string& host :
         std::vector<std::string>{"attacker.example:" + p, "attacker.example", "127.0.0.1:1",
                                  "localhost.attacker.example", "127.0.0.1.nip.io:" + p, ""}) {
        const HttpResponse r = get_with(port, "/v1/models", "Host: " + host + "\r\n");
        EXPECT_EQ(r.status, 403) << host;
        EXPECT_EQ(get_with(port, "/health", "Host: " + host + "\r\n").status, 403) << host;
    }
    EXPECT_EQ(
        post_with(port, "Host: attacker.example:" + p + "\r\nContent-Type: application/json\r\n",
                  chat("Hi", 2).dump())
            .status,
        403);
    // RFC 9112 §3.2: none on HTTP/1.1, or two, is a 400; HTTP/1.0 may leave it out.
    EXPECT_EQ(get_with(port, "/health", "").status, 400);
    EXPECT_EQ(get_with(port, "/health", "Host: 127.0.0.1\r\nHost: 127.0.0.1\r\n").status, 400);
    EXPECT_EQ(get_with(port, "/health", "", "HTTP/1.0").status, 200);
}

TEST_F(HttpOriginTest, AllowedHostsAreAnsweredAndCheckedWithAKeyToo) {
    api::GatewayOptions o;
    o.allowed_hosts = {"chat.lan", "proxy.example:443"};
    o.access.api_keys = {"k"};
    const uint16_t port = start(o);
    const std::string key = "Authorization: Bearer k\r\n";
    EXPECT_EQ(get_with(port, "/v1/models", key + "Host: chat.lan:8000\r\n").status, 200);
    EXPECT_EQ(get_with(port, "/v1/models", key + "Host: CHAT.lan\r\n").status, 200);
    EXPECT_EQ(get_with(port, "/v1/models", key + "Host: proxy.example:443\r\n").status, 200);
    EXPECT_EQ(get_with(port, "/v1/models", key + "Host: proxy.example:80\r\n").status, 403);
    EXPECT_EQ(get_with(port, "/v1/models", key + "Host: attacker.example\r\n").status, 403);
    EXPECT_EQ(get_with(port, "/v1/models", key + "Host: 127.0.0.1\r\n").status, 200);
}

TEST_F(HttpOriginTest, WithAKeyAndNoAllowedHostsAnyHostIsServed) {
    api::GatewayOptions o;
    o.access.api_keys = {"k"};
    const uint16_t port = start(o);
    EXPECT_EQ(
        get_with(port, "/v1/models", "Authorization: Bearer k\r\nHost: api.example.com\r\n").status,
        200);
}

// A web page may post text/plain (or a form) to any address without a preflight: no body
// that is not JSON is served, and a request from an Origin not allowed is refused.
TEST_F(HttpOriginTest, ACrossOriginTextPlainPostIsRefused) {
    const uint16_t port = start({});
    const std::string body = chat("Hi", 2).dump();
    const std::string host = "Host: 127.0.0.1:" + std::to_string(port) + "\r\n";
    HttpResponse r = post_with(port,
                               host +
                                   "Origin: http://attacker.example\r\n"
                                   "Content-Type: text/plain\r\n",
                               body);
    EXPECT_EQ(r.status, 403) << r.body;
    r = post_with(port, host + "Content-Type: text/plain;charset=UTF-8\r\n", body);
    EXPECT_EQ(r.status, 415) << r.body;
    r = post_with(port, host + "Content-Type: application/x-www-form-urlencoded\r\n", body);
    EXPECT_EQ(r.status, 415) << r.body;
    r = post_with(port, host, body);  // no Content-Type at all
    EXPECT_EQ(r.status, 415) << r.body;
    r = post_with(
        port, host + "Origin: http://attacker.example\r\nContent-Type: application/json\r\n", body);
    EXPECT_EQ(r.status, 403) << r.body;
    EXPECT_EQ(r.headers.count("access-control-allow-origin"), 0u);
    r = post_with(port, host + "Content-Type: Application/JSON; charset=utf-8\r\n", body);
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(decode_->stats().turns, 1) << "only the JSON post ran";
}

TEST_F(HttpOriginTest, PreflightsAndAnswersNameOnlyAllowedOrigins) {
    api::GatewayOptions o;
    o.allowed_origins = {"http://app.example:3000"};
    const uint16_t port = start(o);
    const std::string host = "Host: 127.0.0.1:" + std::to_string(port) + "\r\n";
    auto preflight = [&](const std::string& origin) {
        return parse_http_response(
            http_raw(port,
                     "OPTIONS /v1/chat/completions HTTP/1.1\r\nConnection: close\r\n" + host +
                         "Origin: " + origin +
                         "\r\nAccess-Control-Request-Method: POST\r\n"
                         "Access-Control-Request-Headers: content-type, authorization\r\n\r\n",
                     5000));
    };
    HttpResponse r = preflight("http://app.example:3000");
    EXPECT_EQ(r.status, 204);
    EXPECT_EQ(r.headers["access-control-allow-origin"], "http://app.example:3000");
    EXPECT_EQ(r.headers["access-control-allow-methods"], "POST");
    EXPECT_NE(r.headers["access-control-allow-headers"].find("Authorization"), std::string::npos);
    EXPECT_EQ(r.headers["vary"], "Origin");
    r = preflight("http://attacker.example");
    EXPECT_EQ(r.status, 403);
    EXPECT_EQ(r.headers.count("access-control-allow-origin"), 0u);
    // The allowed origin's requests carry the header, streamed or not.
    const std::string from_app = host +
                                 "Origin: http://app.example:3000\r\n"
                                 "Content-Type: application/json\r\n";
    r = post_with(port, from_app, chat("Hi", 2).dump());
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.headers["access-control-allow-origin"], "http://app.example:3000");
    r = post_with(port, from_app, chat("Hi", 2, /*stream=*/true).dump());
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.headers["access-control-allow-origin"], "http://app.example:3000");
    r = get_with(port, "/health", host + "Origin: http://attacker.example\r\n");
    EXPECT_EQ(r.status, 403);
}

}  // namespace
}  // namespace deltaserve::testing
