// A cluster whose nodes join through real etcd (tests/support/etcd_members.h) instead of the
// config's lists: nodes started with --name/--rpc/--data register, the gateway uses them as
// they come, drops one killed with kill -9 within its lease's TTL, and a node stopped with
// SIGTERM finishes its running turn before it leaves.
#include <gtest/gtest.h>

#include <poll.h>

#include <functional>
#include <future>

#include "etcd_members.h"
#include "local_cluster.h"
#include "serving.h"

namespace deltaserve::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
}

class EtcdCluster {
  public:
    explicit EtcdCluster(const std::string& more_yaml = "", int members = 1) : etcd_(members) {
        dir_ = std::filesystem::temp_directory_path() /
               ("deltaserve-etcd-cluster-" + std::to_string(getpid()));
        std::filesystem::create_directories(dir_);
        gateway_rpc_ = free_port();
        std::ofstream yaml(config());
        yaml << "model: " << default_gguf_model() << "\n"
             << "threads: 1\nctx_size: 2048\nlocal_prefill_max: 0\ndata_dir: none\n"
             << "cluster_token: etcd-test-secret\nadmin_key: " << kAdminKey << "\n"
             << "gateway: {rpc: \"127.0.0.1:" << gateway_rpc_ << "\"}\n"
             << "transport: {tls: tcp}\n"
             << "etcd: [\"" << join(etcd_.endpoints()) << "\"]\n"
             << "etcd_prefix: /deltaserve/test/\nmember_ttl: 2\ndrain_seconds: 20\n"
             << more_yaml;
    }
    ~EtcdCluster() { std::filesystem::remove_all(dir_); }
    static std::string join(const std::vector<std::string>& v) {
        std::string out;
        for (const std::string& e : v) out += (out.empty() ? "" : "\", \"") + e;
        return out;
    }
    EtcdMembers& etcd() { return etcd_; }
    bool etcd_ready() const { return etcd_.ready(); }
    std::string config() const { return (dir_ / "cluster.yaml").string(); }

    // A node of `role` named `name` on free ports, registering itself.
    std::unique_ptr<ServingProcess> node(const std::string& role, const std::string& name,
                                         const std::vector<std::string>& more = {}) {
        std::vector<std::string> args = {role,
                                         "--config",
                                         config(),
                                         "--name",
                                         name,
                                         "--rpc",
                                         "127.0.0.1:" + std::to_string(free_port())};
        if (role == "decode")
            args.insert(args.end(), {"--data", "127.0.0.1:" + std::to_string(free_port())});
        args.insert(args.end(), more.begin(), more.end());
        return std::make_unique<ServingProcess>(args, "serving RPC on");
    }
    std::string path(const std::string& name) const { return (dir_ / name).string(); }
    std::unique_ptr<ServingProcess> gateway() {
        return std::make_unique<ServingProcess>(
            std::vector<std::string>{"gateway", "--config", config(), "--port", "0"});
    }
    // The decode nodes the gateway would route to now (deltactl cluster).
    std::vector<std::string> decode_nodes() const {
        const CliResult r = run_binary(
            deltactl_binary(), {"cluster", "--server", "127.0.0.1:" + std::to_string(gateway_rpc_),
                                "--admin-key", kAdminKey, "--json"});
        std::vector<std::string> names;
        if (r.exit_code != 0) return names;
        const json j = json::parse(r.out, nullptr, false);
        if (!j.is_object() || !j["decode"].is_array()) return names;
        for (const json& n : j["decode"]) names.push_back(n["name"].get<std::string>());
        return names;
    }
    // Waits until the gateway's decode nodes are `want`; the seconds it took, or -1.
    double wait_nodes(const std::vector<std::string>& want, std::chrono::seconds limit) const {
        const auto t0 = Clock::now();
        while (Clock::now() - t0 < limit) {
            if (decode_nodes() == want) return since(t0);
            std::this_thread::sleep_for(50ms);
        }
        return -1;
    }

    static constexpr const char* kAdminKey = "etcd-admin-secret";

  private:
    EtcdMembers etcd_;
    std::filesystem::path dir_;
    uint16_t gateway_rpc_ = 0;
};

std::string greedy_answer(uint16_t port, int tokens) {
    json body = chat_body("Tell me about the sea and the ships that sail on it.", tokens);
    body["temperature"] = 0;
    const HttpResponse r = post_chat(port, body);
    if (r.status != 200) return "HTTP " + std::to_string(r.status) + ": " + r.body;
    return json::parse(r.body)["choices"][0]["message"]["content"].get<std::string>();
}

TEST(ClusterEtcdTest, NodesJoinAndLeaveThroughEtcdWithoutTouchingTheConfig) {
    REQUIRE_ETCD();
    EtcdCluster cluster;
    ASSERT_TRUE(cluster.etcd_ready());
    auto p0 = cluster.node("prefill", "p0");
    auto d0 = cluster.node("decode", "d0");
    ASSERT_TRUE(p0->ready()) << p0->log();
    ASSERT_TRUE(d0->ready()) << d0->log();
    EXPECT_NE(d0->log().find("registered in etcd as /deltaserve/test/members/decode/d0"),
              std::string::npos)
        << d0->log();
    auto gw = cluster.gateway();
    ASSERT_NE(gw->port(), 0) << gw->log();
    EXPECT_NE(gw->log().find("etcd lists 1 decode and 1 prefill nodes"), std::string::npos)
        << gw->log();
    const std::string first = greedy_answer(gw->port(), 16);
    ASSERT_EQ(first.rfind("HTTP ", 0), std::string::npos) << first;

    // A node started later is routed to within about a second (the gateway's watch, then
    // its connection), with no restart and no config edit.
    const auto started = Clock::now();
    const std::string ready = cluster.path("d1.ready");  // a readiness probe's file
    auto d1 = cluster.node("decode", "d1", {"--ready-file", ready});
    ASSERT_TRUE(d1->ready()) << d1->log();
    const double joined = cluster.wait_nodes({"d0", "d1"}, 10s);
    ASSERT_GE(joined, 0) << gw->log();
    const double join_s = since(started);
    EXPECT_TRUE(std::filesystem::exists(ready));
    // deltactl cluster: the members etcd lists, their leases' time left and drain state,
    // beside the nodes' load.
    const CliResult view =
        run_binary(deltactl_binary(), {"cluster", "--config", cluster.config(), "--json"});
    ASSERT_EQ(view.exit_code, 0) << view.describe();
    const json members = json::parse(view.out)["members"];
    ASSERT_EQ(members.size(), 4u) << view.out;  // d0, d1, the gateway, p0
    for (const json& m : members) {
        EXPECT_GE(m["ttl_left"].get<int>(), 0) << m;
        EXPECT_LE(m["ttl_left"].get<int>(), 2) << m;
        EXPECT_EQ(m["draining"], false) << m;
        EXPECT_NE(m["lease"], 0) << m;
    }
    EXPECT_EQ(members[0]["name"], "d0");
    EXPECT_EQ(members[2]["role"], "gateway");
    EXPECT_EQ(members[2]["http"], "127.0.0.1:" + std::to_string(gw->port()));
    EXPECT_EQ(members[3]["role"], "prefill");
    const CliResult table =
        run_binary(deltactl_binary(), {"cluster", "--config", cluster.config()});
    EXPECT_NE(table.out.find("Members (etcd):"), std::string::npos) << table.describe();
    EXPECT_NE(table.out.find("serving"), std::string::npos) << table.out;

    // kill -9: dropped within the lease's TTL (2 s) and the time to see it.
    d0->kill9();
    const auto died = Clock::now();
    const double dropped = cluster.wait_nodes({"d1"}, 10s);
    ASSERT_GE(dropped, 0) << gw->log();
    EXPECT_LT(since(died), 4.0);
    const double drop_s = since(died);
    // The next turn runs on the node that is left, with the same greedy answer.
    EXPECT_EQ(greedy_answer(gw->port(), 16), first);

    // SIGTERM while a turn runs: the node drains (no new turn goes to it: d2 takes them),
    // its turn ends whole, then it leaves.
    auto d2 = cluster.node("decode", "d2");
    ASSERT_TRUE(d2->ready()) << d2->log();
    ASSERT_GE(cluster.wait_nodes({"d1", "d2"}, 10s), 0) << gw->log();
    // Both idle: least loaded picks the first listed, d1. A long answer holds it.
    auto running = std::async(std::launch::async, [&] {
        json body = chat_body("Write a long story about a lighthouse keeper.", 160);
        body["temperature"] = 0;
        return post_chat(gw->port(), body);
    });
    const auto t_run = Clock::now();
    while (since(t_run) < 10 && d1->log().find("draining") == std::string::npos) {
        // Until the turn is on d1 (its stats say it runs), then stop it.
        const CliResult r =
            run_binary(deltactl_binary(), {"cluster", "--config", cluster.config(), "--json"});
        const json j = json::parse(r.out, nullptr, false);
        bool on_d1 = false;
        if (j.is_object() && j["decode"].is_array()) {
            for (const json& n : j["decode"])
                on_d1 |= n["name"] == "d1" && n.value("running", 0) > 0;
        }
        if (on_d1) break;
        std::this_thread::sleep_for(20ms);
    }
    std::thread stopper([&] { EXPECT_EQ(d1->stop(), 0) << d1->log(); });
    ASSERT_GE(cluster.wait_nodes({"d2"}, 5s), 0) << gw->log();
    // Meanwhile new turns go to d2.
    EXPECT_EQ(greedy_answer(gw->port(), 16), first);
    const HttpResponse r = running.get();
    stopper.join();
    ASSERT_EQ(r.status, 200) << r.body << d1->log();
    EXPECT_EQ(json::parse(r.body)["usage"]["completion_tokens"], 160) << r.body;
    EXPECT_NE(d1->log().find("draining: 1 turns running"), std::string::npos) << d1->log();
    EXPECT_NE(d1->log().find("left the cluster"), std::string::npos) << d1->log();
    EXPECT_FALSE(std::filesystem::exists(ready));  // gone once it drained
    std::printf(
        "a node joined and was routed to %.2f s after it started (%.2f s after it was "
        "ready); after kill -9 it left the gateway's nodes in %.2f s (TTL 2 s)\n",
        join_s, joined, drop_s);
    EXPECT_EQ(gw->stop(), 0) << gw->log();
}

// Streams a chat; once `pieces` content chunks have come, runs `act` (a kill) and reads on to
// the end. The answer as the client saw it.
Streamed stream_through(uint16_t port, const json& body, int pieces,
                        const std::function<void()>& act, double* resumed_s = nullptr) {
    const std::string text = body.dump();
    const std::string req =
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/json\r\nContent-Length: " +
        std::to_string(text.size()) + "\r\n\r\n" + text;
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::string raw;
    bool acted = false;
    Clock::time_point acted_at;
    size_t count_at_act = 0;
    if (resumed_s != nullptr) *resumed_s = -1;
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
        send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
        char buf[8192];
        const auto deadline = Clock::now() + 120s;
        while (Clock::now() < deadline) {
            pollfd p{fd, POLLIN, 0};
            if (poll(&p, 1, 1000) <= 0) continue;
            const ssize_t n = recv(fd, buf, sizeof buf, 0);
            if (n <= 0) break;
            raw.append(buf, static_cast<size_t>(n));
            size_t count = 0;
            for (size_t at = 0; (at = raw.find("\"content\":", at)) != std::string::npos; ++at)
                ++count;
            if (!acted && count >= static_cast<size_t>(pieces)) {
                act();
                acted = true;
                acted_at = Clock::now();
                count_at_act = count;
            } else if (acted && resumed_s != nullptr && *resumed_s < 0 && count > count_at_act) {
                *resumed_s = since(acted_at);  // the first piece after the act
            }
            if (raw.find("data: [DONE]") != std::string::npos) break;
        }
    }
    close(fd);
    Streamed s = parse_sse(parse_http_response(raw).body);
    if (!acted) s.error += " (ended before the act)";
    return s;
}

json long_body(bool sampled, int tokens = 96) {
    json body = chat_body("Write a story about a lighthouse keeper and a storm.", tokens, true);
    body["stream_options"] = {{"include_usage", true}};
    body["temperature"] = sampled ? 0.9 : 0.0;
    if (sampled) body["seed"] = 5;
    return body;
}

double metric_of(uint16_t port, const std::string& name) {
    const HttpResponse r = http_request(port, "GET", "/metrics");
    const size_t at = r.body.find("\n" + name + " ");
    return at == std::string::npos ? -1 : std::atof(r.body.c_str() + at + name.size() + 2);
}

// kill -9 of the decode node a stream runs on: the gateway goes on on another node from the
// prompt and the tokens sent, and the client's stream is the one an uninterrupted run gives.
TEST(ClusterEtcdTest, StreamsOnADecodeNodeKilledMidAnswerGoOnElsewhereUnchanged) {
    REQUIRE_ETCD();
    EtcdCluster cluster;
    ASSERT_TRUE(cluster.etcd_ready());
    auto p0 = cluster.node("prefill", "p0");
    auto d0 = cluster.node("decode", "d0");
    ASSERT_TRUE(p0->ready() && d0->ready()) << p0->log() << d0->log();
    auto gw = cluster.gateway();
    ASSERT_NE(gw->port(), 0) << gw->log();
    const Streamed greedy = parse_sse(post_chat(gw->port(), long_body(false)).body);
    const Streamed sampled = parse_sse(post_chat(gw->port(), long_body(true)).body);
    ASSERT_EQ(greedy.usage["completion_tokens"], 96) << greedy.error;
    ASSERT_EQ(sampled.usage["completion_tokens"], 96) << sampled.error;
    ASSERT_NE(greedy.text, sampled.text);

    auto d1 = cluster.node("decode", "d1");
    ASSERT_TRUE(d1->ready()) << d1->log();
    ASSERT_GE(cluster.wait_nodes({"d0", "d1"}, 10s), 0) << gw->log();
    // Both idle: the turn goes to d0, which dies 12 pieces in.
    double resumed = -1;
    const Streamed moved = stream_through(
        gw->port(), long_body(false), 12, [&] { d0->kill9(); }, &resumed);
    EXPECT_TRUE(moved.done) << moved.error << gw->log();
    EXPECT_EQ(moved.text, greedy.text);
    EXPECT_EQ(moved.finish_reason, "length");
    EXPECT_EQ(moved.usage["completion_tokens"], 96);
    EXPECT_EQ(moved.usage["prompt_tokens"], greedy.usage["prompt_tokens"]);
    EXPECT_EQ(metric_of(gw->port(), "deltaserve_turn_moves_total"), 1);

    // A sampled stream continues from the same random state: d1 dies, d2 takes it.
    auto d2 = cluster.node("decode", "d2");
    ASSERT_TRUE(d2->ready()) << d2->log();
    ASSERT_GE(cluster.wait_nodes({"d1", "d2"}, 10s), 0) << gw->log();
    const Streamed sampled_moved =
        stream_through(gw->port(), long_body(true), 20, [&] { d1->kill9(); });
    EXPECT_TRUE(sampled_moved.done) << sampled_moved.error << gw->log();
    EXPECT_EQ(sampled_moved.text, sampled.text);
    EXPECT_EQ(sampled_moved.usage["completion_tokens"], 96);
    EXPECT_EQ(metric_of(gw->port(), "deltaserve_turn_moves_total"), 2);
    std::printf(
        "a stream whose decode node was killed 12 pieces in had its next piece %.3f s "
        "after the kill (greedy and sampled answers as uninterrupted)\n",
        resumed);
    EXPECT_GT(resumed, 0);
    EXPECT_EQ(gw->stop(), 0) << gw->log();
}

// Eight streams on one node when it dies: every one completes whole on the node that is left,
// each as an uninterrupted run.
TEST(ClusterEtcdTest, EightStreamsOnAKilledNodeAllComplete) {
    REQUIRE_ETCD();
    EtcdCluster cluster;
    ASSERT_TRUE(cluster.etcd_ready());
    auto p0 = cluster.node("prefill", "p0");
    auto d0 = cluster.node("decode", "d0");
    ASSERT_TRUE(p0->ready() && d0->ready()) << p0->log() << d0->log();
    auto gw = cluster.gateway();
    ASSERT_NE(gw->port(), 0) << gw->log();
    const Streamed alone = parse_sse(post_chat(gw->port(), long_body(false, 200)).body);
    ASSERT_EQ(alone.usage["completion_tokens"], 200) << alone.error;
    // Eight at once on d0 (the only node), d1 joins, d0 dies with all eight under way.
    std::atomic<int> started{0};
    std::vector<std::future<Streamed>> streams;
    std::unique_ptr<ServingProcess> d1;
    for (int i = 0; i < 8; ++i) {
        streams.push_back(std::async(std::launch::async, [&] {
            return stream_through(gw->port(), long_body(false, 200), 8, [&] { ++started; });
        }));
    }
    const auto t0 = Clock::now();
    while (started.load() < 8 && Clock::now() - t0 < 60s) std::this_thread::sleep_for(20ms);
    ASSERT_EQ(started.load(), 8);
    d1 = cluster.node("decode", "d1");
    ASSERT_TRUE(d1->ready()) << d1->log();
    ASSERT_GE(cluster.wait_nodes({"d0", "d1"}, 10s), 0) << gw->log();
    d0->kill9();
    const auto died = Clock::now();
    int same = 0;
    for (auto& f : streams) {
        const Streamed s = f.get();
        EXPECT_TRUE(s.done) << s.error;
        EXPECT_EQ(s.usage["completion_tokens"], 200) << s.error;
        same += s.text == alone.text;
    }
    std::printf(
        "8 streams on a node killed mid-answer: all ended %.2f s after the kill; %d of 8 "
        "texts equal an uninterrupted run's\n",
        since(died), same);
    EXPECT_EQ(same, 8);
    EXPECT_EQ(metric_of(gw->port(), "deltaserve_turn_moves_total"), 8);
}

// etcd's own trouble: a member killed, then the leader; then etcd without a quorum for twice
// the members' TTL. The cluster serves throughout with the members it knows, and its
// membership is whole again once etcd is.
TEST(ClusterEtcdTest, ServingGoesOnThroughEtcdLosingAMemberItsLeaderAndItsQuorum) {
    REQUIRE_ETCD();
    EtcdCluster cluster("", 3);
    ASSERT_TRUE(cluster.etcd_ready());
    EtcdMembers& etcd = cluster.etcd();
    auto p0 = cluster.node("prefill", "p0");
    auto d0 = cluster.node("decode", "d0");
    ASSERT_TRUE(p0->ready() && d0->ready()) << p0->log() << d0->log();
    auto gw = cluster.gateway();
    ASSERT_NE(gw->port(), 0) << gw->log();
    const std::string answer = greedy_answer(gw->port(), 12);
    ASSERT_EQ(answer.rfind("HTTP ", 0), std::string::npos) << answer;

    // A follower dies, and comes back; then the leader dies.
    const int leader = etcd.leader();
    ASSERT_GE(leader, 0);
    const int follower = (leader + 1) % 3;
    etcd.kill(follower);
    EXPECT_EQ(greedy_answer(gw->port(), 12), answer);
    auto d1 = cluster.node("decode", "d1");  // joins through the two left
    ASSERT_TRUE(d1->ready()) << d1->log();
    EXPECT_GE(cluster.wait_nodes({"d0", "d1"}, 15s), 0) << gw->log();
    ASSERT_TRUE(etcd.restart(follower)) << etcd.log(follower);
    etcd.kill(leader);
    EXPECT_EQ(greedy_answer(gw->port(), 12), answer);
    // Past the TTL with a new leader: nobody was dropped, and a node still joins.
    std::this_thread::sleep_for(3s);
    EXPECT_EQ(cluster.decode_nodes(), (std::vector<std::string>{"d0", "d1"})) << gw->log();
    const auto t_d2 = Clock::now();
    auto d2 = cluster.node("decode", "d2");
    ASSERT_TRUE(d2->ready()) << d2->log();
    EXPECT_GE(cluster.wait_nodes({"d0", "d1", "d2"}, 15s), 0) << gw->log();
    const double d2_joined = since(t_d2);

    // No quorum (one member of three) for twice the TTL: the gateway keeps the members it
    // knows and answers; back to a quorum, every node is still a member.
    const int second = etcd.leader();
    ASSERT_GE(second, 0);
    etcd.kill(second);
    const auto t_down = Clock::now();
    int answered = 0;
    while (since(t_down) < 4.0) {
        answered += greedy_answer(gw->port(), 12) == answer;
        std::this_thread::sleep_for(200ms);
    }
    EXPECT_GT(answered, 0);
    EXPECT_EQ(cluster.decode_nodes(), (std::vector<std::string>{"d0", "d1", "d2"}));
    ASSERT_TRUE(etcd.restart(second)) << etcd.log(second);
    ASSERT_TRUE(etcd.restart(leader)) << etcd.log(leader);
    const auto t_back = Clock::now();
    bool whole = false;
    while (!whole && since(t_back) < 20) {
        const CliResult r =
            run_binary(deltactl_binary(), {"cluster", "--config", cluster.config(), "--json"});
        const json j = json::parse(r.out, nullptr, false);
        whole = j.is_object() && j["members"].is_array() && j["members"].size() == 5;
        if (!whole) std::this_thread::sleep_for(200ms);
    }
    EXPECT_TRUE(whole);
    EXPECT_EQ(greedy_answer(gw->port(), 12), answer);
    std::printf(
        "etcd lost a follower, then its leader (a node started after joined in %.2f s), then "
        "its quorum for 4 s: %d answers came meanwhile, the members were all listed %.2f s "
        "after the quorum was back\n",
        d2_joined, answered, since(t_back));
    EXPECT_EQ(gw->stop(), 0) << gw->log();
}

// Sixteen clients chat while a decode node is added and another is drained and leaves: no
// request fails.
TEST(ClusterEtcdTest, SixteenClientsChatThroughANodeAddedAndOneDrained) {
    REQUIRE_ETCD();
    EtcdCluster cluster;
    ASSERT_TRUE(cluster.etcd_ready());
    auto p0 = cluster.node("prefill", "p0");
    auto d0 = cluster.node("decode", "d0");
    auto d1 = cluster.node("decode", "d1");
    ASSERT_TRUE(p0->ready() && d0->ready() && d1->ready()) << d0->log() << d1->log();
    auto gw = cluster.gateway();
    ASSERT_NE(gw->port(), 0) << gw->log();
    ASSERT_GE(cluster.wait_nodes({"d0", "d1"}, 10s), 0) << gw->log();
    std::atomic<bool> stop{false};
    std::atomic<int> done{0}, failed{0};
    std::mutex mu;
    std::string first_failure;
    std::vector<std::thread> clients;
    for (int i = 0; i < 16; ++i) {
        clients.emplace_back([&, i] {
            while (!stop.load()) {
                json body = chat_body("Say something about the number " + std::to_string(i), 8);
                const HttpResponse r = post_chat(gw->port(), body);
                if (r.status == 200) {
                    ++done;
                } else {
                    ++failed;
                    std::lock_guard<std::mutex> lock(mu);
                    if (first_failure.empty())
                        first_failure = std::to_string(r.status) + " " + r.body;
                }
            }
        });
    }
    std::this_thread::sleep_for(2s);
    auto d2 = cluster.node("decode", "d2");
    ASSERT_TRUE(d2->ready()) << d2->log();
    EXPECT_GE(cluster.wait_nodes({"d0", "d1", "d2"}, 10s), 0) << gw->log();
    std::this_thread::sleep_for(2s);
    const int before_drain = done.load();
    EXPECT_EQ(d0->stop(), 0) << d0->log();  // SIGTERM: drains, then leaves
    EXPECT_GE(cluster.wait_nodes({"d1", "d2"}, 10s), 0) << gw->log();
    std::this_thread::sleep_for(2s);
    stop = true;
    for (auto& t : clients) t.join();
    std::printf("16 clients: %d requests answered, %d failed, while d2 joined and d0 drained\n",
                done.load(), failed.load());
    EXPECT_EQ(failed.load(), 0) << first_failure;
    EXPECT_GT(done.load(), before_drain);
    EXPECT_NE(d0->log().find("left the cluster"), std::string::npos) << d0->log();
    EXPECT_EQ(gw->stop(), 0) << gw->log();
}

TEST(ClusterEtcdTest, ANameTakenByALiveMemberIsRefused) {
    REQUIRE_ETCD();
    EtcdCluster cluster;
    ASSERT_TRUE(cluster.etcd_ready());
    auto d0 = cluster.node("decode", "d0");
    ASSERT_TRUE(d0->ready()) << d0->log();
    const CliResult twin = run_deltaserve({"decode", "--config", cluster.config(), "--name", "d0",
                                           "--rpc", "127.0.0.1:" + std::to_string(free_port()),
                                           "--data", "127.0.0.1:" + std::to_string(free_port())},
                                          "", std::chrono::seconds(60));
    EXPECT_EQ(twin.exit_code, 1) << twin.describe();
    EXPECT_NE(twin.err.find("is registered by a live member"), std::string::npos)
        << twin.describe();
    // A node the config does not list needs its address.
    const CliResult nameless =
        run_deltaserve({"decode", "--config", cluster.config(), "--name", "dx"});
    EXPECT_EQ(nameless.exit_code, 2) << nameless.describe();
    EXPECT_NE(nameless.err.find("needs --rpc"), std::string::npos) << nameless.describe();
}

}  // namespace
}  // namespace deltaserve::testing
