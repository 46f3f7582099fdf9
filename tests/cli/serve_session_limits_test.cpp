// deltaserve serve --data-dir bounds the sessions it keeps: per API key and in all, by count
// and by the bytes of their conversations, across a restart; GET /v1/sessions is paged
// (limit, after) with a bounded default.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <set>

#include "cli_runner.h"
#include "http_client.h"
#include "serving.h"
#include "test_paths.h"

namespace deltaserve::testing {
namespace {

namespace fs = std::filesystem;

std::string key(const std::string& k) { return "Authorization: Bearer " + k + "\r\n"; }

class SessionLimitsTest : public ::testing::Test {
  protected:
    void SetUp() override {
        DS_REQUIRE_FILE(default_gguf_model(), "default GGUF model");
        dir_ = (fs::temp_directory_path() / ("ds_session_limits_" + std::to_string(::getpid())))
                   .string();
        fs::remove_all(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }
    std::vector<std::string> args(const std::vector<std::string>& more) {
        std::vector<std::string> a = {"--data-dir", dir_, "--api-key", "k1", "--api-key", "k2"};
        a.insert(a.end(), more.begin(), more.end());
        return serve_args(a);
    }
    HttpResponse open(uint16_t port, const std::string& k, const std::string& id) {
        return http_request(port, "POST", "/v1/sessions", json{{"id", id}}.dump(), key(k));
    }
    std::string dir_;
};

TEST_F(SessionLimitsTest, OpeningBeyondTheCapsIs429AndTheCountsOutliveARestart) {
    const auto flags =
        args({"--max-stored-sessions", "5", "--max-stored-sessions-per-tenant", "3"});
    {
        ServingProcess server(flags);
        ASSERT_NE(server.port(), 0) << server.log();
        for (const char* id : {"a", "b", "c"}) EXPECT_EQ(open(server.port(), "k1", id).status, 200);
        HttpResponse r = open(server.port(), "k1", "d");
        EXPECT_EQ(r.status, 429) << r.body;
        EXPECT_EQ(json::parse(r.body)["error"]["code"], "too_many_sessions") << r.body;
        EXPECT_NE(r.body.find("--max-stored-sessions-per-tenant"), std::string::npos) << r.body;
        for (const char* id : {"a", "b"}) EXPECT_EQ(open(server.port(), "k2", id).status, 200);
        r = open(server.port(), "k2", "c");  // 5 in all
        EXPECT_EQ(r.status, 429) << r.body;
        EXPECT_NE(r.body.find("--max-stored-sessions "), std::string::npos) << r.body;
        // A deleted one makes room.
        EXPECT_EQ(http_request(server.port(), "DELETE", "/v1/sessions/a", "", key("k1")).status,
                  200);
        EXPECT_EQ(open(server.port(), "k2", "c").status, 200);
        server.kill9();
    }
    ServingProcess again(flags);
    ASSERT_NE(again.port(), 0) << again.log();
    EXPECT_EQ(open(again.port(), "k1", "e").status, 429) << "the stored sessions are counted";
    EXPECT_EQ(http_request(again.port(), "DELETE", "/v1/sessions/b", "", key("k1")).status, 200);
    EXPECT_EQ(open(again.port(), "k1", "e").status, 200);
}

TEST_F(SessionLimitsTest, ATenantsConversationsAreBoundedByBytes) {
    ServingProcess server(args({"--max-stored-bytes-per-tenant", "1500"}));
    ASSERT_NE(server.port(), 0) << server.log();
    ASSERT_EQ(open(server.port(), "k1", "long").status, 200);
    ASSERT_EQ(open(server.port(), "k2", "other").status, 200);
    int status = 200, turns = 0;
    for (; turns < 20 && status == 200; ++turns) {
        const HttpResponse r =
            post_chat(server.port(), chat_body("Tell me a long story about bees, please.", 32),
                      key("k1") + "X-Session-ID: long\r\n");
        status = r.status;
        if (status != 200) {
            EXPECT_EQ(status, 429) << r.body;
            EXPECT_NE(r.body.find("--max-stored-bytes-per-tenant"), std::string::npos) << r.body;
        }
    }
    EXPECT_EQ(status, 429) << "never refused after " << turns << " turns";
    EXPECT_GT(turns, 1);
    // The other key is not held back.
    const HttpResponse r =
        post_chat(server.port(), chat_body("Hello.", 8), key("k2") + "X-Session-ID: other\r\n");
    EXPECT_EQ(r.status, 200) << r.body;
}

TEST_F(SessionLimitsTest, TheListIsPagedInIdOrder) {
    ServingProcess server(args({}));
    ASSERT_NE(server.port(), 0) << server.log();
    std::set<std::string> opened;
    for (int i = 0; i < 7; ++i) {
        const std::string id = "s" + std::to_string(i);
        ASSERT_EQ(open(server.port(), "k1", id).status, 200);
        opened.insert(id);
    }
    ASSERT_EQ(open(server.port(), "k2", "theirs").status, 200);
    std::vector<std::string> seen;
    std::string after;
    for (int page = 0; page < 10; ++page) {
        const std::string target =
            "/v1/sessions?limit=3" + (after.empty() ? "" : "&after=" + after);
        const HttpResponse r = http_request(server.port(), "GET", target, "", key("k1"));
        ASSERT_EQ(r.status, 200) << r.body;
        const json j = json::parse(r.body);
        EXPECT_LE(j["data"].size(), 3u);
        for (const json& s : j["data"]) seen.push_back(s["id"]);
        if (!j["has_more"].get<bool>()) break;
        after = j["last_id"];
    }
    EXPECT_EQ(seen, std::vector<std::string>(opened.begin(), opened.end()));
    // The default page is bounded; a limit out of range is refused.
    const json all =
        json::parse(http_request(server.port(), "GET", "/v1/sessions", "", key("k1")).body);
    EXPECT_EQ(all["data"].size(), 7u);
    EXPECT_EQ(all["has_more"], false);
    EXPECT_EQ(http_request(server.port(), "GET", "/v1/sessions?limit=0", "", key("k1")).status,
              400);
    EXPECT_EQ(http_request(server.port(), "GET", "/v1/sessions?limit=5000", "", key("k1")).status,
              400);
    EXPECT_EQ(http_request(server.port(), "GET", "/v1/sessions?after=..%2f", "", key("k1")).status,
              400);
}

}  // namespace
}  // namespace deltaserve::testing
