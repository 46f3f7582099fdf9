// Soak: 32 clients on `deltaserve serve` for DELTASERVE_SOAK_SECONDS (default 60; the closing
// note of issue 34 gives a 300 s run) mixing turns in their sessions (whole and streamed),
// stateless turns, malformed requests, slow readers, clients that leave mid-stream,
// pipelined requests (a turn, a GET and a stream in one write) and half-sent requests. Asserts: the
// server never dies, every good request is answered rightly, its RSS and thread count stay bounded
// (printed), and once the clients closed their sessions no session, KV byte or connection is left,
// and what it allocated (deltaserve_heap_bytes) and its open files are back where they were. The
// same against a local cluster whose decode node is killed and restarted halfway: turns that
// overlap the outage may fail with 503 (a stream with an error event), turns sent once the node is
// back up are answered (sessions recompute their history there).
#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include "local_cluster.h"
#include "serving.h"

namespace deltaserve::testing {
namespace {

using Clock = std::chrono::steady_clock;

int soak_seconds() {
    const char* v = std::getenv("DELTASERVE_SOAK_SECONDS");
    return v != nullptr && std::atoi(v) > 0 ? std::atoi(v) : 60;
}

// VmRSS (KiB) and Threads of a process.
std::pair<int64_t, int64_t> rss_and_threads(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    int64_t rss = -1, threads = -1;
    while (std::getline(in, line)) {
        if (line.rfind("VmRSS:", 0) == 0) rss = std::atoll(line.c_str() + 6);
        if (line.rfind("Threads:", 0) == 0) threads = std::atoll(line.c_str() + 8);
    }
    return {rss, threads};
}

// The gauges of one /metrics answer (-1 where absent). One request per sample: the
// connection of the previous sample may still be closing when the next one is counted.
std::map<std::string, double> gauges(uint16_t port, const std::vector<std::string>& names) {
    const HttpResponse r = http_request(port, "GET", "/metrics");
    std::map<std::string, double> out;
    for (const std::string& name : names) {
        const size_t at = r.body.find("\n" + name + " ");
        out[name] = at == std::string::npos ? -1 : std::atof(r.body.c_str() + at + name.size() + 2);
    }
    return out;
}

// Seconds since the soak began, for messages.
double since(Clock::time_point start, Clock::time_point t = Clock::now()) {
    return std::chrono::duration<double>(t - start).count();
}

struct Tally {
    const Clock::time_point start = Clock::now();
    std::atomic<int> good{0}, good_failed{0}, bad{0}, bad_wrong{0}, abusive{0}, outage{0};
    std::string failures;  // the first few, each with when it was sent
    std::mutex mu;
    void fail(const std::string& what, Clock::time_point sent = Clock::now()) {
        if (++good_failed > 5) return;
        char at[32];
        std::snprintf(at, sizeof at, "[sent at %.1f s] ", since(start, sent));
        std::lock_guard<std::mutex> lock(mu);
        failures += at + what + "\n";
    }
};

// A decode node down: a request that overlapped [kill, back up] may get 503 (or a stream
// that ends in an error); one sent after the node is back may not.
struct Outage {
    std::atomic<bool> on{false};
    std::atomic<Clock::rep> began{0}, ended{0};  // when it began and ended (0: not yet)
    void start() {
        began = Clock::now().time_since_epoch().count();
        on = true;
    }
    void end() {
        ended = Clock::now().time_since_epoch().count();
        on = false;
    }
    bool overlaps(Clock::time_point sent) const {
        return on || sent.time_since_epoch().count() < ended.load();
    }
    // "the outage: 30.1 s to 31.4 s" on the soak's clock.
    std::string describe(Clock::time_point start) const {
        const auto at = [&](Clock::rep r) {
            return since(start, Clock::time_point(Clock::duration(r)));
        };
        char s[64];
        std::snprintf(s, sizeof s, "the outage: %.1f s to %.1f s", at(began), at(ended));
        return s;
    }
};

// One client: its own session, and a random mix of what clients do.
void client(uint16_t port, int index, Clock::time_point until, Tally& t, const Outage& outage) {
    std::mt19937 rng(static_cast<uint32_t>(index));
    const std::string session = "soak-" + std::to_string(index);
    bool open = false;
    int tokens = 0;
    Clock::time_point sent;  // when the request being answered was sent
    const auto answered = [&](const HttpResponse& r, const char* what) {
        if (r.status == 200) return true;
        if (r.status == 503 && outage.overlaps(sent)) {
            ++t.outage;
            return false;
        }
        t.fail(std::string(what) + ": " + std::to_string(r.status) + " " + r.body.substr(0, 200),
               sent);
        return false;
    };
    while (Clock::now() < until) {
        const int pick = static_cast<int>(rng() % 100);
        if (!open || tokens > 1500) {  // a fresh session before the context fills
            if (open) http_request(port, "DELETE", "/v1/sessions/" + session);
            sent = Clock::now();
            const int status = open_session(port, session);
            open = status == 200;
            tokens = 0;
            if (!open && !outage.overlaps(sent))
                t.fail("opening " + session + ": " + std::to_string(status), sent);
            if (!open) std::this_thread::sleep_for(std::chrono::milliseconds(200));
            continue;
        }
        if (pick < 40) {  // a turn in its session, whole or streamed
            json body =
                chat_body("Tell me one fact about the number " + std::to_string(rng() % 1000) + ".",
                          8 + static_cast<int>(rng() % 8), pick % 2 == 0);
            body["session_id"] = session;
            sent = Clock::now();
            const HttpResponse r = post_chat(port, body);
            ++t.good;
            if (!answered(r, "session turn")) {
                if (r.status == 404) open = false;
                continue;
            }
            if (pick % 2 == 0) {
                const Streamed s = parse_sse(r.body);
                if (outage.overlaps(sent) && !s.error.empty()) {
                    ++t.outage;  // the node went down mid-stream: the stream says so
                } else if (!s.done || s.finish_reason.empty()) {
                    t.fail("stream without its end: " + r.body.substr(0, 300), sent);
                }
            } else {
                const json j = json::parse(r.body, nullptr, false);
                const json::json_pointer content("/choices/0/message/content"),
                    total("/usage/total_tokens");
                const bool whole = j.is_object() && j.contains(content) &&
                                   j.at(content).is_string() && j.contains(total) &&
                                   j.at(total).is_number_integer();
                if (!whole) {
                    t.fail("not an answer: " + r.body.substr(0, 300), sent);
                } else {
                    tokens = j.at(total);
                }
            }
        } else if (pick < 50) {  // stateless
            ++t.good;
            sent = Clock::now();
            answered(post_chat(port, chat_body("Say hello.", 6)), "stateless turn");
        } else if (pick < 60) {  // malformed: wrong types, bad JSON, unknown sessions
            static const char* bodies[] = {
                R"({"messages": [{"role": "user", "content": [{"type": "text", "text": 7}]}]})",
                R"({"messages": [{"role": "user", "content": "hi"}], "stream_options": "x"})",
                R"({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"})",
                R"({"messages": [)",
                R"([[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]])",
                R"({"messages": [{"role": "user", "content": "hi"}], "session_id": "no\u000d\u000ahdr"})"};
            const HttpResponse r = http_request(port, "POST", "/v1/chat/completions",
                                                bodies[rng() % std::size(bodies)]);
            ++t.bad;
            if (r.status != 400) {
                ++t.bad_wrong;
                t.fail("malformed got " + std::to_string(r.status) + " " + r.body.substr(0, 200));
            }
        } else if (pick < 70) {  // a slow reader: reads a little, slowly, then leaves
            ++t.abusive;
            const std::string b = chat_body("Tell me a long story.", 200, true).dump();
            const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
            int small = 2048;
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
            sockaddr_in a{};
            a.sin_family = AF_INET;
            a.sin_port = htons(port);
            a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
                const std::string req =
                    "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    "Content-Type: application/json\r\nContent-Length: " +
                    std::to_string(b.size()) + "\r\n\r\n" + b;
                (void)!send(fd, req.data(), req.size(), MSG_NOSIGNAL);
                char buf[64];
                for (int i = 0; i < 20; ++i) {
                    std::this_thread::sleep_for(std::chrono::milliseconds(100));
                    if (recv(fd, buf, sizeof buf, MSG_DONTWAIT) == 0) break;
                }
            }
            close(fd);
        } else if (pick < 80) {  // leaves mid-stream
            ++t.abusive;
            const std::string b = chat_body("Tell me a long story.", 100, true).dump();
            http_raw(port,
                     "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     "Content-Type: application/json\r\nContent-Length: " +
                         std::to_string(b.size()) + "\r\n\r\n" + b,
                     30000, 400);
        } else if (pick < 85) {  // pipelined: a turn, a GET and a stream behind it, one write
            ++t.good;
            sent = Clock::now();
            const auto keep_alive_post = [](const json& body, bool last) {
                const std::string b = body.dump();
                return "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n" +
                       std::string(last ? "Connection: close\r\n" : "") +
                       "Content-Type: application/json\r\nContent-Length: " +
                       std::to_string(b.size()) + "\r\n\r\n" + b;
            };
            const std::string raw =
                http_raw(port,
                         keep_alive_post(chat_body("Say yes.", 4), false) +
                             "GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" +
                             keep_alive_post(chat_body("Say no.", 4, true), true),
                         120000);
            int ok = 0;
            for (size_t at = 0; (at = raw.find("HTTP/1.1 200 OK\r\n", at)) != std::string::npos;
                 ++at) {
                ++ok;
            }
            if (ok != 3 && raw.find("HTTP/1.1 503") != std::string::npos && outage.overlaps(sent)) {
                ++t.outage;
            } else if (ok != 3 || raw.find("data: [DONE]") == std::string::npos) {
                t.fail("pipelined: " + std::to_string(ok) + " of 3 answered: " + raw.substr(0, 300),
                       sent);
            }
        } else if (pick < 90) {  // half-sent, then gone
            ++t.abusive;
            http_raw(port, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Len",
                     1000);
        } else {
            ++t.good;
            sent = Clock::now();
            answered(http_request(port, "GET", "/health"), "health");
        }
    }
    if (open) http_request(port, "DELETE", "/v1/sessions/" + session);
}

struct Peak {
    int64_t rss_start = 0, rss_max = 0, threads_start = 0, threads_max = 0;  // KiB
    int64_t kv_max = 0;     // the most KV the server reported holding, KiB
    int64_t beyond_kv = 0;  // the most RSS beyond the KV held at the time, KiB (a gateway of a
                            // cluster holds none: there it is its RSS)
    // What the server allocated (deltaserve_heap_bytes) and its open files, before.
    double heap_start = 0, heap_max = 0, fds_start = 0;
};

constexpr const char* kHeap = "deltaserve_heap_bytes";
constexpr const char* kFds = "process_open_fds";
constexpr const char* kPrefix = "deltaserve_prefix_cache_bytes";

// Runs 32 clients against port until `seconds` pass, sampling pid's RSS and threads, the KV
// the server holds (sessions grow: the RSS that is not KV is what must stay flat) and what
// it allocated.
// kv_here: the KV is in pid (serve), not in other processes (a cluster's gateway).
Peak soak(uint16_t port, pid_t pid, bool kv_here, int seconds, Tally& t, const Outage& outage,
          const std::function<void()>& halfway = {}) {
    Peak p;
    std::tie(p.rss_start, p.threads_start) = rss_and_threads(pid);
    auto g = gauges(port, {kHeap, kFds});
    p.heap_start = p.heap_max = g[kHeap];
    p.fds_start = g[kFds];
    const auto until = Clock::now() + std::chrono::seconds(seconds);
    std::vector<std::thread> clients;
    for (int i = 0; i < 32; ++i) {
        clients.emplace_back([&, i] { client(port, i, until, t, outage); });
    }
    bool half_done = !halfway;
    while (Clock::now() < until) {
        auto [rss, threads] = rss_and_threads(pid);
        g = gauges(port, {"deltaserve_kv_bytes", kPrefix, kHeap});
        // KV: what sessions and turns hold, and the prefix cache's blocks.
        const int64_t kv =
            static_cast<int64_t>(std::max(0.0, g["deltaserve_kv_bytes"] + g[kPrefix]) / 1024);
        p.heap_max = std::max(p.heap_max, g[kHeap]);
        p.rss_max = std::max(p.rss_max, rss);
        p.threads_max = std::max(p.threads_max, threads);
        p.kv_max = std::max(p.kv_max, kv);
        p.beyond_kv = std::max(p.beyond_kv, kv_here ? rss - kv : rss);
        if (!half_done && Clock::now() > until - std::chrono::seconds(seconds / 2)) {
            half_done = true;
            halfway();
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    for (auto& c : clients) c.join();
    std::printf(
        "soak %d s: %d good requests (%d failed, %d 503 in an outage), %d malformed (%d not "
        "400), %d abusive; RSS %lld -> max %lld MiB (KV held, all nodes: max %lld MiB; RSS beyond "
        "the KV: max %lld MiB), allocated %.0f -> max %.0f MiB, threads %lld -> max %lld\n",
        seconds, t.good.load(), t.good_failed.load(), t.outage.load(), t.bad.load(),
        t.bad_wrong.load(), t.abusive.load(), static_cast<long long>(p.rss_start / 1024),
        static_cast<long long>(p.rss_max / 1024), static_cast<long long>(p.kv_max / 1024),
        static_cast<long long>(p.beyond_kv / 1024), p.heap_start / (1 << 20),
        p.heap_max / (1 << 20), static_cast<long long>(p.threads_start),
        static_cast<long long>(p.threads_max));
    return p;
}

class SoakTest : public ::testing::Test {
  protected:
    void SetUp() override { DS_REQUIRE_FILE(default_gguf_model(), "default GGUF model"); }
};

TEST_F(SoakTest, ThirtyTwoClientsGoodAndBadLeaveNothingBehind) {
    ServingProcess server(serve_args({"--ctx-size", "2048", "--max-sessions", "64"}));
    ASSERT_NE(server.port(), 0) << server.log();
    const uint16_t port = server.port();
    Tally t;
    const Outage none;
    const Peak p = soak(port, server.pid(), true, soak_seconds(), t, none);
    EXPECT_EQ(t.good_failed.load(), 0) << t.failures;
    EXPECT_GT(t.good.load(), 32);
    EXPECT_GT(t.bad.load(), 0);
    // Bounded: a fixed set of threads (I/O, turns, workers); memory is the model, the KV the
    // sessions hold (it grows with their conversations), buffers that grow to their largest
    // batch and what malloc keeps of freed blocks (the leak check is the heap, below).
    EXPECT_LE(p.threads_max, p.threads_start + 4);
    EXPECT_LT(p.beyond_kv, p.rss_start + 512 * 1024) << "RSS beyond the KV grew by 512 MiB";
    // Nothing left: the clients closed their sessions; the abusive connections are gone
    // (closing ones may take a moment to be reaped, hence the wait).
    const std::vector<std::string> names = {"deltaserve_sessions",
                                            "deltaserve_kv_bytes",
                                            "deltaserve_queue_length",
                                            "deltaserve_http_connections",
                                            kHeap,
                                            kFds,
                                            kPrefix};
    const auto until = Clock::now() + std::chrono::seconds(15);
    std::map<std::string, double> g = gauges(port, names);
    while (Clock::now() < until &&
           (g["deltaserve_sessions"] != 0 || g["deltaserve_kv_bytes"] != 0 ||
            g["deltaserve_queue_length"] != 0 || g["deltaserve_http_connections"] > 1)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        g = gauges(port, names);
    }
    EXPECT_EQ(g["deltaserve_sessions"], 0);
    EXPECT_EQ(g["deltaserve_kv_bytes"], 0);
    EXPECT_EQ(g["deltaserve_queue_length"], 0);
    EXPECT_LE(g["deltaserve_http_connections"], 1) << "only the metrics request";
    // Nothing leaked: what is still allocated is what was before, with the buffers that grew
    // to the largest batch and the prefix cache's blocks (kept for later prompts, within
    // its budget); the files open are the same (the metrics request aside).
    std::printf(
        "after: allocated %.0f MiB (%.0f MiB of it the prefix cache), %.0f files open (before: "
        "%.0f MiB, %.0f files)\n",
        g[kHeap] / (1 << 20), g[kPrefix] / (1 << 20), g[kFds], p.heap_start / (1 << 20),
        p.fds_start);
    EXPECT_LE(g[kPrefix], 1 << 30) << "the prefix cache's default budget";
    EXPECT_LT(g[kHeap] - g[kPrefix], p.heap_start + 64 * (1 << 20)) << "allocated bytes not freed";
    EXPECT_LE(g[kFds], p.fds_start + 1) << "files left open";
    EXPECT_EQ(server.stop(), 0) << server.log();
}

// A local cluster (gateway, prefill node, decode node, each a process) under the same mix;
// halfway its decode node is killed and started again. During the outage turns get 503;
// afterwards they are answered again, the sessions recomputing their history on the new
// node; the gateway never dies.
TEST_F(SoakTest, AClusterWhoseDecodeNodeIsKilledAndRestartedRecovers) {
    Cluster cluster;
    ASSERT_TRUE(cluster.up()) << cluster.logs();
    const uint16_t port = cluster.port();
    Tally t;
    Outage outage;
    std::thread restarter;
    const Peak p = soak(port, cluster.gateway().pid(), false, soak_seconds(), t, outage, [&] {
        outage.start();
        kill(cluster.decode().pid(), SIGKILL);
        restarter = std::thread([&] {
            const bool up = cluster.restart_decode();
            EXPECT_TRUE(up) << cluster.decode().log();
            std::printf("decode node up again after %d tries\n", cluster.restarts_tried());
            EXPECT_LE(cluster.restarts_tried(), 3) << "its addresses were still held";
            outage.end();
        });
    });
    if (restarter.joinable()) restarter.join();
    EXPECT_EQ(t.good_failed.load(), 0) << t.failures << outage.describe(t.start) << "\n"
                                       << cluster.logs(3000);
    EXPECT_GT(t.outage.load(), 0) << "the outage was seen";
    EXPECT_LE(p.threads_max, p.threads_start + 4) << "the gateway's threads";
    // Answered again after the restart.
    const HttpResponse r = post_chat(port, chat_body("Hello", 4));
    EXPECT_EQ(r.status, 200) << r.body;
    // The gateway leaked nothing either: its allocations and open files are back where they
    // were (closing connections may take a moment to be reaped).
    const auto until = Clock::now() + std::chrono::seconds(15);
    auto g = gauges(port, {kHeap, kFds});
    while (Clock::now() < until && g[kFds] > p.fds_start + 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        g = gauges(port, {kHeap, kFds});
    }
    std::printf("after: allocated %.0f MiB, %.0f files open (before: %.0f MiB, %.0f files)\n",
                g[kHeap] / (1 << 20), g[kFds], p.heap_start / (1 << 20), p.fds_start);
    EXPECT_LT(g[kHeap], p.heap_start + 64 * (1 << 20)) << "allocated bytes not freed";
    EXPECT_LE(g[kFds], p.fds_start + 1) << "files left open";
    EXPECT_EQ(cluster.gateway().stop(), 0) << cluster.gateway().log();
}

}  // namespace
}  // namespace deltaserve::testing
