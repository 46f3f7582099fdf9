// deltaserve serve's HTTP rule flags end to end: --allowed-host (repeated and comma-separated)
// widens the Host names a keyless server answers, --allowed-origin the browser origins it
// serves and answers preflights for, and a bad --queue-timeout-ms is a usage error.
#include <gtest/gtest.h>

#include "cli_runner.h"
#include "http_client.h"
#include "serving.h"
#include "test_paths.h"

namespace deltaserve::testing {
namespace {

HttpResponse get_as(uint16_t port, const std::string& host, const std::string& more = "") {
    return parse_http_response(http_raw(
        port,
        "GET /v1/models HTTP/1.1\r\nConnection: close\r\nHost: " + host + "\r\n" + more + "\r\n",
        10000));
}

TEST(ServeHttpFlagsTest, AllowedHostsAndOriginsAreServedAndOthersRefused) {
    DS_REQUIRE_FILE(default_gguf_model(), "default GGUF model");
    ServingProcess server(
        serve_args({"--allowed-host", "chat.lan", "--allowed-host", "a.lan,b.lan:9000",
                    "--allowed-origin", "http://app.example:3000", "--queue-timeout-ms", "500"}));
    ASSERT_NE(server.port(), 0) << server.log();
    const uint16_t port = server.port();
    const std::string self = "127.0.0.1:" + std::to_string(port);
    EXPECT_EQ(get_as(port, self).status, 200);
    EXPECT_EQ(get_as(port, "chat.lan:8000").status, 200);
    EXPECT_EQ(get_as(port, "a.lan").status, 200);
    EXPECT_EQ(get_as(port, "b.lan:9000").status, 200);
    EXPECT_EQ(get_as(port, "b.lan:9001").status, 403);
    EXPECT_EQ(get_as(port, "attacker.example:" + std::to_string(port)).status, 403);
    HttpResponse r = get_as(port, self, "Origin: http://app.example:3000\r\n");
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(r.headers["access-control-allow-origin"], "http://app.example:3000");
    EXPECT_EQ(get_as(port, self, "Origin: http://attacker.example\r\n").status, 403);
    r = parse_http_response(http_raw(
        port,
        "OPTIONS /v1/chat/completions HTTP/1.1\r\nConnection: close\r\nHost: " + self +
            "\r\nOrigin: http://app.example:3000\r\nAccess-Control-Request-Method: POST\r\n\r\n",
        10000));
    EXPECT_EQ(r.status, 204);
    EXPECT_EQ(r.headers["access-control-allow-methods"], "POST");
    EXPECT_EQ(server.stop(), 0) << server.log();
}

TEST(ServeHttpFlagsTest, AQueueTimeoutBelowOneIsAUsageError) {
    const CliResult r = run_deltaserve({"serve", "--queue-timeout-ms", "0", "--port", "0"});
    EXPECT_EQ(r.exit_code, 2) << r.describe();
    EXPECT_NE(r.err.find("--queue-timeout-ms"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace deltaserve::testing
