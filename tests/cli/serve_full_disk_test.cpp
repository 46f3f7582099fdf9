// deltaserve serve on a disk that fills while it serves: a real tmpfs of 40 MiB, mounted in a
// mount namespace of the test's own (a process holds it; the server runs in it through
// nsenter, and the disk is filled and freed from there). The server never crashes, every
// turn is answered, the answer says whether its session's record was stored, /health and
// /metrics say the store is degraded, storing resumes when space returns, and after kill -9
// every session turn answered as stored is there.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "cli_runner.h"
#include "http_client.h"
#include "serving.h"
#include "test_paths.h"

namespace deltaserve::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

class FullDiskServeTest : public ::testing::Test {
  protected:
    void SetUp() override {
        DS_REQUIRE_FILE(default_gguf_model(), "default GGUF model");
        if (::geteuid() != 0) GTEST_SKIP() << "mounting a small tmpfs needs root (CI runs as root)";
        if (std::system("unshare -m true 2>/dev/null") != 0)
            GTEST_SKIP() << "no mount namespaces here (unshare -m failed)";
        dir_ = (fs::temp_directory_path() / ("ds_full_disk_serve_" + std::to_string(::getpid())))
                   .string();
        fs::create_directories(dir_);
        // The namespace's holder: mounts the tmpfs, says so, and sleeps (bounded).
        const std::string script =
            "mount -t tmpfs -o size=40m tmpfs '" + dir_ + "' && echo mounted && exec sleep 900";
        int out[2];
        ASSERT_EQ(::pipe(out), 0);
        holder_ = ::fork();
        ASSERT_GE(holder_, 0);
        if (holder_ == 0) {
            ::dup2(out[1], 1);
            ::close(out[0]);
            ::execl("/usr/bin/unshare", "unshare", "-m", "--propagation", "private", "/bin/sh",
                    "-c", script.c_str(), static_cast<char*>(nullptr));
            ::_exit(127);
        }
        ::close(out[1]);
        char buf[16] = {};
        const ssize_t n = ::read(out[0], buf, sizeof buf - 1);
        ::close(out[0]);
        ASSERT_GT(n, 0) << "the tmpfs was not mounted";
        ASSERT_EQ(std::string(buf, 7), "mounted");
    }
    void TearDown() override {
        if (holder_ > 0) {
            ::kill(holder_, SIGKILL);
            ::waitpid(holder_, nullptr, 0);
        }
        if (!dir_.empty()) fs::remove_all(dir_);
    }
    // A shell command inside the namespace.
    void in_namespace(const std::string& cmd) {
        const std::string full =
            "nsenter -t " + std::to_string(holder_) + " -m -- sh -c '" + cmd + "' >/dev/null 2>&1";
        (void)std::system(full.c_str());
    }
    std::vector<std::string> server_args() {
        std::vector<std::string> a = {"-t", std::to_string(holder_), "-m", "--",
                                      deltaserve_binary()};
        const auto s = serve_args({"--data-dir", dir_, "--kv-disk-reserve", "8MiB"});
        a.insert(a.end(), s.begin(), s.end());
        return a;
    }
    json turn(uint16_t port, const std::string& session, const std::string& message) {
        const HttpResponse r =
            post_chat(port, chat_body(message, 8), "X-Session-ID: " + session + "\r\n");
        EXPECT_EQ(r.status, 200) << r.body;
        return json::parse(r.body, nullptr, false);
    }
    static bool admitting(uint16_t port) {
        const std::string m = http_request(port, "GET", "/metrics").body;
        return m.find("deltaserve_disk_tier_admitting 1\n") != std::string::npos;
    }

    std::string dir_;
    pid_t holder_ = -1;
};

TEST_F(FullDiskServeTest, AFillingDiskNeverCrashesAndLosesNothingAcknowledged) {
    std::map<std::string, int> stored_turns;  // the last turn answered as stored
    {
        ServingProcess server(server_args(), "http://127.0.0.1:", "/usr/bin/nsenter");
        ASSERT_NE(server.port(), 0) << server.log();
        const uint16_t port = server.port();
        ASSERT_EQ(open_session(port, "ada"), 200);
        ASSERT_EQ(open_session(port, "bob"), 200);
        json a = turn(port, "ada", "My name is Ada and I keep bees.");
        ASSERT_EQ(a["session_stored"], true) << a.dump();
        stored_turns["ada"] = a["session_turn"];
        EXPECT_TRUE(admitting(port));

        // Into the reserve: no KV block is stored, the records still are.
        const std::string gap = dir_ + "/gap", filler = dir_ + "/filler";
        in_namespace("dd if=/dev/zero of=" + gap + " bs=1M count=6; dd if=/dev/zero of=" + filler +
                     " bs=1M count=64; rm " + gap);
        for (const char* s : {"ada", "bob"}) {
            a = turn(port, s, "What do I keep? One sentence.");
            EXPECT_EQ(a["session_stored"], true) << a.dump();
            if (a["session_stored"] == true) stored_turns[s] = a["session_turn"];
        }
        EXPECT_FALSE(admitting(port));
        const HttpResponse health = http_request(port, "GET", "/health");
        EXPECT_EQ(health.status, 200);
        EXPECT_NE(health.body.find("degraded"), std::string::npos) << health.body;

        // To the last byte: turns are answered, saying their record was not stored.
        in_namespace("dd if=/dev/zero of=" + dir_ + "/filler2 bs=64k count=1000");
        for (int i = 0; i < 3; ++i) {
            a = turn(port, "ada", "Tell me more.");
            EXPECT_EQ(a["session_stored"], false) << a.dump();
        }
        // Space back: storing resumes by itself.
        in_namespace("rm -f " + filler + " " + dir_ + "/filler2");
        bool back = false;
        for (int i = 0; i < 100 && !(back = admitting(port)); ++i)
            std::this_thread::sleep_for(50ms);
        EXPECT_TRUE(back);
        a = turn(port, "ada", "Thanks.");
        EXPECT_EQ(a["session_stored"], true) << a.dump();
        stored_turns["ada"] = a["session_turn"];
        EXPECT_EQ(http_request(port, "GET", "/health").body.find("degraded"), std::string::npos);
        server.kill9();
    }
    // Every session as its last stored answer left it.
    ServingProcess again(server_args(), "http://127.0.0.1:", "/usr/bin/nsenter");
    ASSERT_NE(again.port(), 0) << again.log();
    for (const auto& [id, turns] : stored_turns) {
        const HttpResponse r = http_request(again.port(), "GET", "/v1/sessions/" + id);
        ASSERT_EQ(r.status, 200) << r.body;
        EXPECT_EQ(json::parse(r.body)["turns"], turns) << id;
    }
    const json a = turn(again.port(), "ada", "What is my name?");
    EXPECT_EQ(a["session_turn"], stored_turns["ada"] + 1) << a.dump();
}

// A soak on a disk that fills and frees over and over (DELTASERVE_SOAK_SECONDS / 3, at least
// 10 s): four clients run session turns throughout; every turn is answered 200 and nothing
// crashes; after kill -9 each session holds the turns of its last answer that said stored.
TEST_F(FullDiskServeTest, ASoakOnADiskThatFillsAndFreesLosesNothingAcknowledged) {
    const char* env = std::getenv("DELTASERVE_SOAK_SECONDS");
    const int seconds = std::max(10, (env != nullptr ? std::atoi(env) : 60) / 3);
    std::map<std::string, int> stored_turns;
    std::atomic<int> answered{0}, refused{0}, unstored{0};
    std::string first_refusal;
    {
        ServingProcess server(server_args(), "http://127.0.0.1:", "/usr/bin/nsenter");
        ASSERT_NE(server.port(), 0) << server.log();
        const uint16_t port = server.port();
        const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
        std::mutex mu;
        std::vector<std::thread> clients;
        for (int c = 0; c < 4; ++c) {
            clients.emplace_back([&, c] {
                std::string id;
                for (int i = 0; i < 400 && std::chrono::steady_clock::now() < end; ++i) {
                    // A new session every 20 turns, before one outgrows the context.
                    if (i % 20 == 0) {
                        id = "soak" + std::to_string(c) + "_" + std::to_string(i / 20);
                        if (open_session(port, id) != 200) {
                            ++refused;
                            return;
                        }
                    }
                    const HttpResponse r = post_chat(port, chat_body("Say something.", 4),
                                                     "X-Session-ID: " + id + "\r\n");
                    if (r.status != 200) {
                        std::lock_guard<std::mutex> lock(mu);
                        if (++refused == 1) first_refusal = std::to_string(r.status) + " " + r.body;
                        continue;
                    }
                    ++answered;
                    const json a = json::parse(r.body, nullptr, false);
                    if (a["session_stored"] == true) {
                        std::lock_guard<std::mutex> lock(mu);
                        stored_turns[id] = a["session_turn"];
                    } else {
                        ++unstored;
                    }
                }
            });
        }
        // The disk: full to the last byte, then free, again and again.
        for (int round = 0; std::chrono::steady_clock::now() < end && round < 200; ++round) {
            in_namespace("dd if=/dev/zero of=" + dir_ + "/filler bs=256k count=400");
            std::this_thread::sleep_for(700ms);
            in_namespace("rm -f " + dir_ + "/filler");
            std::this_thread::sleep_for(700ms);
        }
        for (auto& t : clients) t.join();
        EXPECT_EQ(refused.load(), 0) << "the first: " << first_refusal;
        EXPECT_GT(answered.load(), 8);
        EXPECT_EQ(http_request(port, "GET", "/health").status, 200) << "the server is gone";
        server.kill9();
    }
    std::printf("[soak] %d turns answered, %d of them not stored (the disk was full)\n",
                answered.load(), unstored.load());
    ServingProcess again(server_args(), "http://127.0.0.1:", "/usr/bin/nsenter");
    ASSERT_NE(again.port(), 0) << again.log();
    for (const auto& [id, turns] : stored_turns) {
        const HttpResponse r = http_request(again.port(), "GET", "/v1/sessions/" + id);
        ASSERT_EQ(r.status, 200) << r.body;
        EXPECT_EQ(json::parse(r.body)["turns"].get<int>(), turns) << id;
    }
}

}  // namespace
}  // namespace deltaserve::testing
