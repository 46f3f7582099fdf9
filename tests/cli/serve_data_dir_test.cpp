// deltaserve serve --data-dir: sessions outlive the process. A session's turns are stored as
// they end (its KV in the disk tier, its record beside it); after kill -9 and a restart on the
// same directory, its next turn resumes from disk and answers exactly as the same
// conversation does on a server that never stopped. A turn that was running when the process
// died is lost cleanly; stored blocks that were damaged are refused and recomputed; a store
// written for another model or profile is never used.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <regex>
#include <sstream>
#include <thread>

#include "cli_runner.h"
#include "http_client.h"
#include "serving.h"
#include "test_paths.h"

// Under ASan a DeltaKV server takes minutes per prompt here (its compression through the
// instrumented kernels): the ASan run takes full KV's half, and another KV type stands for
// another policy; what DeltaKV stores and takes back is checked under the sanitizers
// in-process by decode_session_store_test.
#if defined(__SANITIZE_ADDRESS__)
#define DS_DATA_DIR_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DS_DATA_DIR_ASAN 1
#endif
#endif

namespace deltaserve::testing {
namespace {

namespace fs = std::filesystem;

const std::vector<std::string> kMessages = {
    "My name is Ada and I keep bees. Say hello to me.",
    "What do bees make? Answer in one sentence.",
    "What is my name, and what do I keep?",
};

[[maybe_unused]] std::vector<std::string> deltakv();

class DataDirTest : public ::testing::TestWithParam<std::vector<std::string>> {
  protected:
    void SetUp() override {
        DS_REQUIRE_FILE(default_gguf_model(), "default GGUF model");
        dir_ = fs::temp_directory_path() /
               ("ds_data_dir_" + std::to_string(::getpid()) + "_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        for (char& c : dir_) {  // parameterized names hold '/'
            if (c == '/' && &c > dir_.data() + fs::temp_directory_path().string().size()) c = '_';
        }
        fs::remove_all(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }

    std::vector<std::string> args(const std::string& data_dir,
                                  const std::vector<std::string>& extra = {}) const {
        std::vector<std::string> more = GetParam();
        more.insert(more.end(), {"--data-dir", data_dir});
        more.insert(more.end(), extra.begin(), extra.end());
        return serve_args(more);
    }
    // The same server without a data dir: one that keeps nothing across restarts.
    std::vector<std::string> plain_args(const std::vector<std::string>& extra = {}) const {
        return args("none", extra);
    }

    std::string dir_;
};

// One turn of session `id` with a request body: the answer's JSON (status checked).
json turn_with(uint16_t port, const std::string& id, const json& body) {
    HttpResponse r = post_chat(port, body, "X-Session-ID: " + id + "\r\n");
    EXPECT_EQ(r.status, 200) << r.body;
    json j = json::parse(r.body, nullptr, false);
    if (r.status == 200) j["kv_source_header"] = r.headers["x-kv-source"];
    return j;
}

// One turn of session `id`: the answer's JSON.
json turn(uint16_t port, const std::string& id, const std::string& message, int max_tokens = 24) {
    return turn_with(port, id, chat_body(message, max_tokens));
}

std::string text_of(const json& answer) {
    return answer["choices"][0]["message"]["content"].get<std::string>();
}

// The three answers of kMessages on a server that never stops (no data dir).
std::vector<std::string> reference(const std::vector<std::string>& server_args) {
    ServingProcess ref(server_args);
    EXPECT_NE(ref.port(), 0) << ref.log();
    EXPECT_EQ(open_session(ref.port(), "ada"), 200);
    std::vector<std::string> out;
    for (const std::string& m : kMessages) out.push_back(text_of(turn(ref.port(), "ada", m)));
    return out;
}

TEST_P(DataDirTest, ASessionResumesFromDiskAfterKill9AndAnswersAsWithoutTheRestart) {
    const std::vector<std::string> expected = reference(plain_args());

    {
        ServingProcess server(args(dir_));
        ASSERT_NE(server.port(), 0) << server.log();
        ASSERT_EQ(open_session(server.port(), "ada"), 200);
        EXPECT_EQ(text_of(turn(server.port(), "ada", kMessages[0])), expected[0]);
        const json second = turn(server.port(), "ada", kMessages[1]);
        EXPECT_EQ(text_of(second), expected[1]);
        EXPECT_EQ(second["usage"]["prompt_tokens_details"]["kv_source"], "decode");
        server.kill9();
    }
    ServingProcess again(args(dir_));
    ASSERT_NE(again.port(), 0) << again.log();
    EXPECT_NE(again.log().find("1 sessions recovered in"), std::string::npos) << again.log();
    // The session is there, with its two turns.
    HttpResponse info = http_request(again.port(), "GET", "/v1/sessions/ada");
    ASSERT_EQ(info.status, 200) << info.body;
    EXPECT_EQ(json::parse(info.body)["turns"], 2);
    // Its history's KV comes from disk, and the answer is the one without a restart.
    const json third = turn(again.port(), "ada", kMessages[2]);
    EXPECT_EQ(text_of(third), expected[2]);
    EXPECT_EQ(third["usage"]["prompt_tokens_details"]["kv_source"], "disk") << third.dump();
    EXPECT_EQ(third["kv_source_header"], "disk");
    EXPECT_GT(third["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 100);
    const std::string metrics = http_request(again.port(), "GET", "/metrics").body;
    EXPECT_NE(metrics.find("deltaserve_sessions_promoted_total{tier=\"disk\"} 1"),
              std::string::npos)
        << metrics;
    EXPECT_NE(
        metrics.find(
            "deltaserve_cached_tokens_total{source=\"disk\"} " +
            std::to_string(third["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>())),
        std::string::npos)
        << metrics;
    EXPECT_NE(metrics.find("deltaserve_tier_load_seconds_count 1\n"), std::string::npos) << metrics;
    // Prometheus text: comments, or a name (labels) and a number, nothing cut short.
    const std::regex sample(R"(^[a-z_]+(\{[a-z]+="[^"]*"\})? -?[0-9.e+-]+(inf)?$)");
    std::istringstream lines(metrics);
    for (std::string l; std::getline(lines, l);) {
        if (l.rfind("# HELP ", 0) == 0 || l.rfind("# TYPE ", 0) == 0) continue;
        EXPECT_TRUE(std::regex_match(l, sample)) << l;
    }
}

// kill -9 while a turn streams: that turn is lost (its client never saw its end), the
// session keeps the turns before it and goes on as if the lost one had never been asked.
TEST_P(DataDirTest, ATurnRunningAtTheCrashIsLostCleanly) {
    const std::vector<std::string> expected = reference(plain_args());
    {
        ServingProcess server(args(dir_));
        ASSERT_NE(server.port(), 0) << server.log();
        ASSERT_EQ(open_session(server.port(), "ada"), 200);
        EXPECT_EQ(text_of(turn(server.port(), "ada", kMessages[0])), expected[0]);
        EXPECT_EQ(text_of(turn(server.port(), "ada", kMessages[1])), expected[1]);
        // A long answer, streamed; the process dies once its first pieces came.
        const int port = server.port();
        std::thread client([port] {
            (void)post_chat(port, chat_body("Write a long story about a dragon.", 600, true),
                            "X-Session-ID: ada\r\n");
        });
        std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        server.kill9();
        client.join();
    }
    ServingProcess again(args(dir_));
    ASSERT_NE(again.port(), 0) << again.log();
    HttpResponse info = http_request(again.port(), "GET", "/v1/sessions/ada");
    ASSERT_EQ(info.status, 200) << info.body;
    EXPECT_EQ(json::parse(info.body)["turns"], 2);
    EXPECT_EQ(text_of(turn(again.port(), "ada", kMessages[2])), expected[2]);
}

// The answer to the whole conversation (kMessages' first `answers.size() + 1` messages
// with the answers between them) sent without a session: computed afresh.
std::string whole(uint16_t port, const std::vector<std::string>& answers) {
    json body = chat_body("", 24);
    body["messages"] = json::array();
    for (size_t i = 0; i <= answers.size(); ++i) {
        body["messages"].push_back({{"role", "user"}, {"content", kMessages[i]}});
        if (i < answers.size())
            body["messages"].push_back({{"role", "assistant"}, {"content", answers[i]}});
    }
    HttpResponse r = post_chat(port, body);
    EXPECT_EQ(r.status, 200) << r.body;
    return text_of(json::parse(r.body));
}

// Two turns of session "ada" on a server of `server_args`, killed after them; the answers.
std::vector<std::string> two_turns_then_kill(const std::vector<std::string>& server_args) {
    ServingProcess server(server_args);
    EXPECT_NE(server.port(), 0) << server.log();
    EXPECT_EQ(open_session(server.port(), "ada"), 200);
    std::vector<std::string> answers;
    for (int i = 0; i < 2; ++i)
        answers.push_back(text_of(turn(server.port(), "ada", kMessages[i])));
    server.kill9();
    return answers;
}

// Stored blocks damaged while the server was down (a bit flipped in each payload file) are
// refused and counted; the turn recomputes what they held and answers as the whole
// conversation computed afresh does.
TEST_P(DataDirTest, DamagedBlocksAreRefusedAndRecomputed) {
    const std::vector<std::string> answers = two_turns_then_kill(args(dir_));
    int damaged = 0;
    for (const auto& e : fs::recursive_directory_iterator(fs::path(dir_) / "kv" / "payload")) {
        if (!e.is_regular_file() || e.file_size() < 64) continue;
        std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
        const auto at = static_cast<std::streamoff>(e.file_size() / 2);
        char c = 0;
        f.seekg(at);
        f.read(&c, 1);
        c = static_cast<char>(c ^ 0x10);
        f.seekp(at);
        f.write(&c, 1);
        ++damaged;
    }
    ASSERT_GT(damaged, 0);
    ServingProcess again(args(dir_));
    ASSERT_NE(again.port(), 0) << again.log();
    const std::string expected = whole(again.port(), answers);
    const json third = turn(again.port(), "ada", kMessages[2]);
    EXPECT_EQ(text_of(third), expected);
    EXPECT_NE(third["usage"]["prompt_tokens_details"].value("kv_source", ""), "disk");
    const std::string metrics = http_request(again.port(), "GET", "/metrics").body;
    EXPECT_EQ(metrics.find("deltaserve_tier_blocks_refused_total 0"), std::string::npos) << metrics;
    EXPECT_NE(metrics.find("deltaserve_tier_blocks_refused_total"), std::string::npos);
    HttpResponse info = http_request(again.port(), "GET", "/v1/sessions/ada");
    ASSERT_EQ(info.status, 200);
    EXPECT_EQ(json::parse(info.body)["turns"], 3);
}

// Records damaged while the server was down (written over with RocksDB's own ldb): a
// gateway record that does not parse is dropped (the session is gone: 404, never served with
// a wrong history); a decode record that does not parse is refused, and the session's turn
// recomputes its history, answering as the conversation computed afresh.
TEST_P(DataDirTest, DamagedRecordsAreDroppedNotServed) {
    if (!fs::exists("/usr/bin/ldb")) GTEST_SKIP() << "ldb (Debian's rocksdb-tools) is absent";
    const std::vector<std::string> answers = two_turns_then_kill(args(dir_));
    const std::string db = "--db=" + (fs::path(dir_) / "kv" / "index").string();
    const CliResult scan = run_binary("/usr/bin/ldb", {db, "--column_family=records", "scan"}, "",
                                      std::chrono::seconds(60));
    ASSERT_EQ(scan.exit_code, 0) << scan.describe();
    const size_t at = scan.out.find("ds/");
    ASSERT_NE(at, std::string::npos) << scan.out;
    const std::string decode_key = scan.out.substr(at, scan.out.find(" : ", at) - at);
    const auto put = [&](const std::string& key, const std::string& value) {
        const CliResult r =
            run_binary("/usr/bin/ldb", {db, "--column_family=records", "put", key, value}, "",
                       std::chrono::seconds(60));
        ASSERT_EQ(r.exit_code, 0) << r.describe();
    };
    put(decode_key, "DSSR garbage");
    put("gw//other", R"({"v":1,"tenant":"","id":"other","turns":"many"})");
    ServingProcess again(args(dir_));
    ASSERT_NE(again.port(), 0) << again.log();
    EXPECT_EQ(http_request(again.port(), "GET", "/v1/sessions/other").status, 404);
    const std::string expected = whole(again.port(), answers);
    const json third = turn(again.port(), "ada", kMessages[2]);
    EXPECT_EQ(text_of(third), expected);
    const std::string metrics = http_request(again.port(), "GET", "/metrics").body;
    EXPECT_EQ(metrics.find("deltaserve_tier_blocks_refused_total 0\n"), std::string::npos)
        << metrics;
    EXPECT_NE(metrics.find("deltaserve_sessions_promoted_total{tier=\"disk\"} 0\n"),
              std::string::npos)
        << metrics;
}

// A long conversation's n-th message, and the answer to the conversation of the first
// answers.size() + 1 of them with `answers` between, sent whole (computed afresh).
std::string fact(size_t i) { return "Tell me fact " + std::to_string(i + 1) + " about bees."; }
std::string whole_facts(uint16_t port, const std::vector<std::string>& answers) {
    json body = chat_body("", 8);
    body["messages"] = json::array();
    for (size_t i = 0; i <= answers.size(); ++i) {
        body["messages"].push_back({{"role", "user"}, {"content", fact(i)}});
        if (i < answers.size())
            body["messages"].push_back({{"role", "assistant"}, {"content", answers[i]}});
    }
    HttpResponse r = post_chat(port, body);
    EXPECT_EQ(r.status, 200) << r.body;
    return r.status == 200 ? text_of(json::parse(r.body)) : "";
}

// kill -9 at moments nobody chose, three times, while a client runs turns back to back (its
// turns' KV is being stored as they end): after each restart the session holds the turns
// whose end was committed, and its next answer is exact (as a server that never stopped
// answers) or, where a store was cut short, computed afresh from its history; never anything
// else.
TEST_P(DataDirTest, Kill9AtAnyMomentNeverServesAWrongAnswer) {
    // Turns run back to back until each kill: on a quiet machine the session outgrows the
    // tests' usual 1024-token context (up to ~90 turns of ~30 tokens).
    const std::vector<std::string> kLongContext = {"--ctx-size", "8192"};
    std::mt19937 rng(20261128);
    std::map<int, std::string> seen;  // the answers the client saw, by turn
    for (int round = 0; round < 3; ++round) {
        ServingProcess server(args(dir_, kLongContext));
        ASSERT_NE(server.port(), 0) << server.log();
        const uint16_t port = server.port();
        if (round == 0) ASSERT_EQ(open_session(port, "ada"), 200);
        HttpResponse info = http_request(port, "GET", "/v1/sessions/ada");
        ASSERT_EQ(info.status, 200) << info.body;
        const int turns = json::parse(info.body)["turns"];
        std::atomic<bool> stop{false};
        std::mutex mu;
        std::thread client([&] {
            for (int i = turns; !stop; ++i) {
                HttpResponse r = post_chat(port, chat_body(fact(static_cast<size_t>(i)), 8),
                                           "X-Session-ID: ada\r\n");
                if (r.status != 200) return;
                const json j = json::parse(r.body, nullptr, false);
                if (!j.is_object() || !j.contains("choices")) return;
                std::lock_guard<std::mutex> lock(mu);
                seen[i] = text_of(j);
            }
        });
        // Each round lets one turn end first (a sanitizer build is slow), then kills at a
        // moment nobody chose: in a prefill, a decode step, a store or between turns.
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
        const size_t before = [&] {
            std::lock_guard<std::mutex> lock(mu);
            return seen.size();
        }();
        for (;;) {
            {
                std::lock_guard<std::mutex> lock(mu);
                if (seen.size() > before) break;
            }
            if (std::chrono::steady_clock::now() > until) break;
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 1500));
        server.kill9();
        stop = true;
        client.join();
    }
    ServingProcess again(args(dir_, kLongContext));
    ASSERT_NE(again.port(), 0) << again.log();
    HttpResponse info = http_request(again.port(), "GET", "/v1/sessions/ada");
    ASSERT_EQ(info.status, 200) << info.body;
    const size_t turns = json::parse(info.body)["turns"].get<size_t>();
    ASSERT_GT(turns, 0u) << "no turn ended in three rounds";
    std::vector<std::string> history;
    for (size_t i = 0; i < turns && seen.count(static_cast<int>(i)) != 0; ++i)
        history.push_back(seen[static_cast<int>(i)]);
    HttpResponse r = post_chat(again.port(), chat_body(fact(turns), 8), "X-Session-ID: ada\r\n");
    ASSERT_EQ(r.status, 200) << r.body;
    const std::string answer = text_of(json::parse(r.body));
    // A turn whose end the server committed but whose answer the client never read (killed
    // in between) leaves a history the test cannot rebuild: then the 200 above is all it
    // checks. Otherwise the answer is the exact one (the history is what a server that never
    // stopped says) or the one computed afresh from the history.
    RecordProperty("turns", static_cast<int>(turns));
    RecordProperty("answers_seen", static_cast<int>(history.size()));
    if (history.size() < turns) return;
    ServingProcess ref(plain_args(kLongContext));
    ASSERT_NE(ref.port(), 0) << ref.log();
    ASSERT_EQ(open_session(ref.port(), "ada"), 200);
    std::vector<std::string> exact;
    for (size_t i = 0; i <= turns; ++i)
        exact.push_back(text_of(turn(ref.port(), "ada", fact(i), 8)));
    const bool same_history = std::equal(history.begin(), history.end(), exact.begin());
    const std::string afresh = whole_facts(again.port(), history);
    EXPECT_TRUE((same_history && answer == exact[turns]) || answer == afresh)
        << "answer: " << answer << "\nexact: " << exact[turns] << "\nafresh: " << afresh;
}

// A store written with one KV policy is opened by a server with another (full KV and DeltaKV
// both ways): nothing of it is used (another fingerprint), and the session's history is
// recomputed.
TEST_P(DataDirTest, AStoreOfAnotherPolicyIsNeverUsed) {
    const std::vector<std::string> answers = two_turns_then_kill(args(dir_));
#ifdef DS_DATA_DIR_ASAN
    std::vector<std::string> other = {"--kv-type", "f32"};  // another fingerprint
#else
    std::vector<std::string> other = GetParam().empty() ? deltakv() : std::vector<std::string>{};
#endif
    other.insert(other.end(), {"--data-dir", dir_});
    ServingProcess again(serve_args(other));
    ASSERT_NE(again.port(), 0) << again.log();
    const std::string expected = whole(again.port(), answers);
    const json third = turn(again.port(), "ada", kMessages[2]);
    EXPECT_EQ(text_of(third), expected);
    EXPECT_NE(third["usage"]["prompt_tokens_details"].value("kv_source", ""), "disk");
}

// A long system prompt another session computed before the restart: a new session that
// starts with it takes its whole blocks from disk instead of prefilling them (full KV, whose
// blocks depend on their tokens alone; DeltaKV's belong to their session), and answers as
// the same prompt computed afresh does.
TEST_P(DataDirTest, ASharedSystemPromptComesBackFromDisk) {
    std::string system = "You are the assistant of a bee farm. ";
    for (int i = 0; i < 25; ++i) system += "Bees visit flowers, make honey and live in hives. ";
    const auto body = [&](const std::string& user) {
        json b = chat_body(user, 16);
        b["messages"] = json::array(
            {{{"role", "system"}, {"content", system}}, {{"role", "user"}, {"content", user}}});
        return b;
    };
    {
        ServingProcess server(args(dir_));
        ASSERT_NE(server.port(), 0) << server.log();
        ASSERT_EQ(open_session(server.port(), "first"), 200);
        ASSERT_EQ(post_chat(server.port(), body("Hello!"), "X-Session-ID: first\r\n").status, 200);
        server.kill9();
    }
    std::string expected;
    {
        ServingProcess fresh(plain_args());
        ASSERT_NE(fresh.port(), 0) << fresh.log();
        HttpResponse r = post_chat(fresh.port(), body("What do bees make?"));
        ASSERT_EQ(r.status, 200) << r.body;
        expected = text_of(json::parse(r.body));
    }
    ServingProcess again(args(dir_));
    ASSERT_NE(again.port(), 0) << again.log();
    ASSERT_EQ(open_session(again.port(), "second"), 200);
    const json answer = turn_with(again.port(), "second", body("What do bees make?"));
    EXPECT_EQ(text_of(answer), expected);
    const json details = answer["usage"]["prompt_tokens_details"];
    if (GetParam().empty()) {
        EXPECT_EQ(details["kv_source"], "disk") << answer.dump();
        EXPECT_GE(details["cached_tokens"].get<int>(), 256) << answer.dump();
    } else {
        EXPECT_FALSE(details.contains("kv_source")) << answer.dump();
    }
}

// More sessions than --max-sessions keeps in memory: the rest stay stored, are listed, and
// come back when named (before a restart and after it).
TEST_P(DataDirTest, SessionsBeyondMemoryStayStored) {
    std::vector<std::string> more = {"--max-sessions", "2"};
    const auto server_args = [&] {
        std::vector<std::string> a = args(dir_);
        a.insert(a.end(), more.begin(), more.end());
        return a;
    };
    {
        ServingProcess server(server_args());
        ASSERT_NE(server.port(), 0) << server.log();
        for (int i = 0; i < 5; ++i) {
            ASSERT_EQ(open_session(server.port(), "s" + std::to_string(i)), 200);
            (void)turn(server.port(), "s" + std::to_string(i), "Hello!", 4);
        }
        HttpResponse list = http_request(server.port(), "GET", "/v1/sessions");
        ASSERT_EQ(list.status, 200);
        EXPECT_EQ(json::parse(list.body)["data"].size(), 5u) << list.body;
        const json again = turn(server.port(), "s0", "And again?", 4);  // out of memory
        EXPECT_EQ(again["usage"]["prompt_tokens_details"]["kv_source"] == "host" ||
                      again["usage"]["prompt_tokens_details"]["kv_source"] == "disk",
                  true)
            << again.dump();
        server.kill9();
    }
    ServingProcess again(server_args());
    ASSERT_NE(again.port(), 0) << again.log();
    EXPECT_NE(again.log().find("5 sessions recovered in"), std::string::npos) << again.log();
    for (int i = 0; i < 5; ++i) {
        HttpResponse info = http_request(again.port(), "GET", "/v1/sessions/s" + std::to_string(i));
        ASSERT_EQ(info.status, 200) << info.body;
        EXPECT_EQ(json::parse(info.body)["turns"], i == 0 ? 2 : 1);
    }
    EXPECT_EQ(turn(again.port(), "s1", "Bye!", 4)["usage"]["prompt_tokens_details"]["kv_source"],
              "disk");
    EXPECT_EQ(http_request(again.port(), "DELETE", "/v1/sessions/s3").status, 200);
    EXPECT_EQ(http_request(again.port(), "GET", "/v1/sessions/s3").status, 404);
}

// The disk fills (here a file size limit, as `ulimit -f` sets it: every payload write past
// it fails as ENOSPC would): the disk tier stops admitting and says so, and the server goes
// on answering the session from memory.
TEST_P(DataDirTest, AFullDiskStopsTheTierNotTheServer) {
    std::vector<std::string> sh = {"-c", "ulimit -f 256 && exec \"$0\" \"$@\"",
                                   deltaserve_binary()};
    const std::vector<std::string> a = args(dir_);
    sh.insert(sh.end(), a.begin(), a.end());
    ServingProcess server(sh, "http://127.0.0.1:", "/bin/sh");
    ASSERT_NE(server.port(), 0) << server.log();
    ASSERT_EQ(open_session(server.port(), "ada"), 200);
    (void)turn(server.port(), "ada", kMessages[0]);
    const json second = turn(server.port(), "ada", kMessages[1]);
    EXPECT_EQ(second["usage"]["prompt_tokens_details"]["kv_source"], "decode") << second.dump();
    const std::string metrics = http_request(server.port(), "GET", "/metrics").body;
    EXPECT_NE(metrics.find("deltaserve_disk_tier_admitting 0\n"), std::string::npos) << metrics;
    EXPECT_EQ(metrics.find("deltaserve_disk_tier_io_errors_total 0\n"), std::string::npos)
        << metrics;
    EXPECT_NE(metrics.find("deltaserve_sessions_persist_failed_total"), std::string::npos);
    EXPECT_EQ(http_request(server.port(), "GET", "/health").status, 200);
}

[[maybe_unused]] std::vector<std::string> deltakv() {
    return {"--kv-policy", "deltakv",      "--kv-keep",
            "0.3",         "--kv-profile", default_deltakv_profile()};
}

#ifdef DS_DATA_DIR_ASAN
const auto kPolicies = ::testing::Values(std::vector<std::string>{});
#else
const auto kPolicies = ::testing::Values(std::vector<std::string>{}, deltakv());
#endif

INSTANTIATE_TEST_SUITE_P(Policies, DataDirTest, kPolicies, [](const auto& info) {
    return info.param.empty() ? "FullKv" : "DeltaKv";
});

}  // namespace
}  // namespace deltaserve::testing
