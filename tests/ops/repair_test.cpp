// A served data dir damaged as an unlucky operator damages one, then verified, refused and
// repaired: flipped bytes in the index's write-ahead log, the log cut short, the index
// deleted, a payload file cut in half or deleted. Each time `deltactl verify` exits 1 naming
// the damage; a damaged index is never served (`serve` refuses to start, naming the damage
// and `deltactl repair`); after `deltactl repair` verify is clean, the server starts, and a
// session whose record could not be vouched for answers 409 session_history_lost until its
// client names the turn it knows, instead of answering from an older history.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "cli_runner.h"
#include "http_client.h"
#include "serving.h"
#include "test_paths.h"

namespace deltaserve::testing {
namespace {

namespace fs = std::filesystem;

CliResult deltactl(const std::vector<std::string>& args) {
    return run_binary(deltactl_binary(), args, "", std::chrono::seconds(60));
}

json turn(uint16_t port, const std::string& session, const std::string& message, int* status,
          json extra = json::object()) {
    json body = chat_body(message, 8);
    body.update(extra);
    const HttpResponse r = post_chat(port, body, "X-Session-ID: " + session + "\r\n");
    *status = r.status;
    return json::parse(r.body, nullptr, false);
}

class RepairTest : public ::testing::Test {
  protected:
    // One served data dir, made once: a session "ada" of three turns, then kill -9. Each
    // test damages a copy of it.
    static void SetUpTestSuite() {
        if (!file_exists(default_gguf_model())) return;
        pristine_ =
            (fs::temp_directory_path() / ("ds_repair_" + std::to_string(::getpid()))).string();
        fs::remove_all(pristine_);
        ServingProcess server(serve_args({"--data-dir", pristine_}));
        ASSERT_NE(server.port(), 0) << server.log();
        ASSERT_EQ(open_session(server.port(), "ada"), 200);
        for (const char* m : {"Hello, I am Ada.", "I keep bees.", "What do I keep?"}) {
            int status = 0;
            const json a = turn(server.port(), "ada", m, &status);
            ASSERT_EQ(status, 200) << a.dump();
            EXPECT_EQ(a["session_stored"], true) << a.dump();
            turn_tokens_.push_back(a["usage"]["prompt_tokens"].get<int>() +
                                   a["usage"]["completion_tokens"].get<int>());
        }
        server.kill9();
    }
    static void TearDownTestSuite() {
        if (!pristine_.empty()) fs::remove_all(pristine_);
    }
    void SetUp() override {
        DS_REQUIRE_FILE(default_gguf_model(), "default GGUF model");
        ASSERT_FALSE(pristine_.empty());
        ASSERT_EQ(turn_tokens_.size(), 3u);
        dir_ = pristine_ + "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
        fs::remove_all(dir_);
        fs::copy(pristine_, dir_, fs::copy_options::recursive);
        ASSERT_EQ(deltactl({"verify", "--data-dir", dir_}).exit_code, 0) << "the copy is bad";
    }
    void TearDown() override { fs::remove_all(dir_); }

    fs::path log_file() const {
        for (const auto& f : fs::directory_iterator(fs::path(dir_) / "kv" / "index"))
            if (f.path().extension() == ".log" && fs::file_size(f.path()) > 0) return f.path();
        return {};
    }
    // The server refuses the store, naming `what` and the repair command; verify says
    // it is damaged.
    void expect_refused_until_repaired(const std::string& what) {
        const CliResult serve = run_binary(deltaserve_binary(), serve_args({"--data-dir", dir_}),
                                           "", std::chrono::seconds(60));
        EXPECT_EQ(serve.exit_code, 1) << serve.describe();
        EXPECT_NE(serve.err.find(what), std::string::npos) << serve.err;
        EXPECT_NE(serve.err.find("deltactl repair --data-dir " + dir_), std::string::npos)
            << serve.err;
        EXPECT_EQ(serve.err.find("another"), std::string::npos) << "blamed on another server";
        const CliResult verify = deltactl({"verify", "--data-dir", dir_});
        EXPECT_EQ(verify.exit_code, 1) << verify.describe();
        EXPECT_NE(verify.err.find("deltactl repair"), std::string::npos) << verify.describe();
    }
    CliResult repair() {
        const CliResult r = deltactl({"repair", "--data-dir", dir_, "--json"});
        EXPECT_EQ(r.exit_code, 0) << r.describe();
        const CliResult verify = deltactl({"verify", "--data-dir", dir_});
        EXPECT_EQ(verify.exit_code, 0) << "not clean after repair: " << verify.describe();
        return r;
    }

    static inline std::string pristine_;
    static inline std::vector<int> turn_tokens_;
    std::string dir_;
};

// The session's record may be older than its client saw: its turn is refused without
// expected_turn, and then goes on from what the record holds.
TEST_F(RepairTest, FlippedLogBytesAreRefusedThenRepairedWithTheSessionMarked) {
    const fs::path log = log_file();
    ASSERT_FALSE(log.empty());
    {
        std::fstream f(log, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(static_cast<std::streamoff>(fs::file_size(log) / 2));
        const std::string junk(32, '\x5a');
        f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
    }
    expect_refused_until_repaired("is damaged");
    const json report = json::parse(repair().out, nullptr, false);
    ASSERT_TRUE(report.is_array() && report.size() == 1) << report.dump();
    EXPECT_EQ(report[0]["index_trusted"], false) << report.dump();
    EXPECT_GT(report[0]["blocks"].get<int>(), 0) << report.dump();

    ServingProcess server(serve_args({"--data-dir", dir_}));
    ASSERT_NE(server.port(), 0) << server.log();
    const HttpResponse info = http_request(server.port(), "GET", "/v1/sessions/ada");
    if (info.status == 404) GTEST_SKIP() << "the damage took the session's record with it";
    ASSERT_EQ(info.status, 200) << info.body;
    const json s = json::parse(info.body, nullptr, false);
    const int turns = s["turns"].get<int>();
    int status = 0;
    json a = turn(server.port(), "ada", "And my name?", &status);
    EXPECT_EQ(status, 409) << a.dump();
    EXPECT_EQ(a["error"]["code"], "session_history_lost") << a.dump();
    a = turn(server.port(), "ada", "And my name?", &status, {{"expected_turn", turns + 1}});
    EXPECT_EQ(status, 409) << a.dump();
    a = turn(server.port(), "ada", "And my name?", &status, {{"expected_turn", turns}});
    ASSERT_EQ(status, 200) << a.dump();
    EXPECT_EQ(a["session_turn"], turns + 1) << a.dump();
    // Its prompt is the history the record holds, and no other.
    if (turns > 0) EXPECT_GT(a["usage"]["prompt_tokens"].get<int>(), turn_tokens_[turns - 1]);
    // Confirmed: the next turn needs no expected_turn.
    a = turn(server.port(), "ada", "Thanks.", &status);
    EXPECT_EQ(status, 200) << a.dump();
}

TEST_F(RepairTest, ALogCutShortIsRefusedThenRepaired) {
    const fs::path log = log_file();
    ASSERT_FALSE(log.empty());
    fs::resize_file(log, fs::file_size(log) / 2);
    expect_refused_until_repaired("index");
    const json report = json::parse(repair().out, nullptr, false);
    EXPECT_EQ(report[0]["index_trusted"], false) << report.dump();
    ServingProcess server(serve_args({"--data-dir", dir_}));
    ASSERT_NE(server.port(), 0) << server.log();
    int status = 0;
    const json a = turn(server.port(), "ada", "And my name?", &status);
    // Never answered from an older history: gone (404) or marked (409).
    EXPECT_TRUE(status == 404 || (status == 409 && a["error"]["code"] == "session_history_lost"))
        << status << " " << a.dump();
}

TEST_F(RepairTest, ADeletedIndexIsRefusedThenTheBlocksAreIndexedAgain) {
    fs::remove_all(fs::path(dir_) / "kv" / "index");
    expect_refused_until_repaired("is missing");
    const json report = json::parse(repair().out, nullptr, false);
    EXPECT_EQ(report[0]["index_trusted"], false) << report.dump();
    EXPECT_GT(report[0]["blocks"].get<int>(), 0) << report.dump();
    EXPECT_EQ(report[0]["records"], 0) << report.dump();
    ServingProcess server(serve_args({"--data-dir", dir_}));
    ASSERT_NE(server.port(), 0) << server.log();
    int status = 0;
    turn(server.port(), "ada", "And my name?", &status);
    EXPECT_EQ(status, 404) << "a session with no record must not be made up";
}

// A payload file cut in half or deleted under the index: verify says so (the server itself
// refuses such blocks and recomputes); repair quarantines the cut one and indexes the rest.
TEST_F(RepairTest, APayloadFileCutOrDeletedIsFoundByVerify) {
    std::vector<fs::path> files;
    for (const auto& f : fs::directory_iterator(fs::path(dir_) / "kv" / "payload"))
        files.push_back(f.path());
    ASSERT_GE(files.size(), 2u);
    std::sort(files.begin(), files.end());
    fs::resize_file(files[0], fs::file_size(files[0]) / 2);
    fs::remove(files[1]);
    const CliResult verify = deltactl({"verify", "--data-dir", dir_, "--json"});
    EXPECT_EQ(verify.exit_code, 1) << verify.describe();
    const json v = json::parse(verify.out, nullptr, false);
    ASSERT_TRUE(v.is_object()) << verify.describe();
    bool cut = false, gone = false;
    for (const json& p : v["problems"]) {
        cut = cut ||
              p["problem"].get<std::string>().find("bytes, the index says") != std::string::npos;
        gone = gone || p["problem"].get<std::string>().find("is gone") != std::string::npos;
    }
    EXPECT_TRUE(cut && gone) << v.dump(2);
    const json report = json::parse(repair().out, nullptr, false);
    EXPECT_EQ(report[0]["index_trusted"], true) << report.dump();
    EXPECT_EQ(report[0]["quarantined"], 1) << report.dump();
    EXPECT_TRUE(fs::exists(fs::path(dir_) / "kv" / "quarantine" / files[0].filename()));
    // The session is whole (its record trusted) and answers; its lost blocks are recomputed.
    ServingProcess server(serve_args({"--data-dir", dir_}));
    ASSERT_NE(server.port(), 0) << server.log();
    int status = 0;
    // A client that expects another turn learns it is not the session's.
    json a = turn(server.port(), "ada", "And my name?", &status, {{"expected_turn", 2}});
    EXPECT_EQ(status, 409) << a.dump();
    EXPECT_EQ(a["error"]["code"], "session_turn_mismatch") << a.dump();
    a = turn(server.port(), "ada", "And my name?", &status, {{"expected_turn", 3}});
    EXPECT_EQ(status, 200) << a.dump();
    EXPECT_EQ(a["session_turn"], 4) << a.dump();
    EXPECT_EQ(a["session_stored"], true) << a.dump();
}

// A data dir another server holds is refused naming that server's pid; the hint is given
// only then (a damaged store's refusal names the damage, above).
TEST_F(RepairTest, ADataDirInUseNamesTheServerHoldingIt) {
    ServingProcess first(serve_args({"--data-dir", dir_}));
    ASSERT_NE(first.port(), 0) << first.log();
    const CliResult second = run_binary(deltaserve_binary(), serve_args({"--data-dir", dir_}), "",
                                        std::chrono::seconds(60));
    EXPECT_EQ(second.exit_code, 1) << second.describe();
    EXPECT_NE(
        second.err.find("in use by another process (pid " + std::to_string(first.pid()) + ")"),
        std::string::npos)
        << second.err;
}

}  // namespace
}  // namespace deltaserve::testing
