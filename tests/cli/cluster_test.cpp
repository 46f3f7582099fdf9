// A local multi-process cluster (deltaserve decode, prefill and gateway from one cluster
// config, talking Cap'n Proto RPC and shipping KV over UCX on loopback), spoken to over HTTP:
// the same greedy answers as `deltaserve serve`, sessions over turns, the openai client; a
// prefill or decode process killed mid-turn ends that request with a clear error (a prefill
// node with another beside it: the turn is retried there) while the gateway stays up and
// nothing stays held; garbage on the RPC and data ports harms nothing.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <filesystem>
#include <fstream>
#include <future>

#include "serving.h"

namespace deltaserve::testing {
namespace {

uint16_t free_port() {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    close(fd);
    return ntohs(a.sin_port);
}

// Sends raw bytes to a TCP port and closes.
void send_garbage(uint16_t port, const std::string& bytes) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
        (void)!write(fd, bytes.data(), bytes.size());
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    close(fd);
}

// Runs a shell command; true when it exits 0.
bool sh(const std::string& command) {
    return std::system((command + " >/dev/null 2>&1").c_str()) == 0;
}

// Two network namespaces ("hosts") on a bridge in this one, for the decode and the prefill
// node; made only where this process may (root with iproute2), else available() is false.
class Namespaces {
  public:
    Namespaces() {
        const std::string p = std::to_string(getpid() % 100000);
        subnet_ = "10.213." + std::to_string(getpid() % 250) + ".";
        bridge_ = "dsb" + p;
        for (const char* path : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
            if (file_exists(path)) ip_binary_ = path;
        }
        if (geteuid() != 0 || ip_binary_.empty()) return;
        ok_ = sh("ip link add " + bridge_ + " type bridge") &&
              sh("ip addr add " + subnet_ + "1/24 dev " + bridge_) &&
              sh("ip link set " + bridge_ + " up");
        for (const char* role : {"d", "p"}) {
            const std::string ns = std::string("ds") + role + p,
                              host = "dsv" + std::string(role) + p,
                              inner = "dsn" + std::string(role) + p;
            const std::string ip = subnet_ + (role[0] == 'd' ? "2" : "3");
            ok_ = ok_ && sh("ip netns add " + ns) &&
                  sh("ip link add " + host + " type veth peer name " + inner) &&
                  sh("ip link set " + inner + " netns " + ns) &&
                  sh("ip link set " + host + " master " + bridge_) &&
                  sh("ip link set " + host + " up") &&
                  sh("ip netns exec " + ns + " ip addr add " + ip + "/24 dev " + inner) &&
                  sh("ip netns exec " + ns + " ip link set " + inner + " up") &&
                  sh("ip netns exec " + ns + " ip link set lo up");
            namespaces_.push_back(ns);
        }
    }
    ~Namespaces() {
        for (const std::string& ns : namespaces_) sh("ip netns del " + ns);
        sh("ip link del " + bridge_);
    }
    bool available() const { return ok_; }
    std::string ns(char role) const { return namespaces_[role == 'd' ? 0 : 1]; }
    std::string ip(char role) const { return subnet_ + (role == 'd' ? "2" : "3"); }
    const std::string& ip_binary() const { return ip_binary_; }

  private:
    bool ok_ = false;
    std::string ip_binary_;
    std::string subnet_, bridge_;
    std::vector<std::string> namespaces_;
};

// A cluster config in a temporary folder and its three processes, on loopback or with the
// decode and prefill nodes in network namespaces of their own (the gateway stays here). KV
// goes over UCX's tcp unless tls says otherwise ("": UCX's choice, and on one host the
// transport's shared pool, as deploy/cluster.yaml has it).
class Cluster {
  public:
    explicit Cluster(const Namespaces* hosts = nullptr, int n_prefill = 1,
                     const std::string& tls = "tcp") {
        dir_ =
            std::filesystem::temp_directory_path() /
            ("deltaserve-cluster-" + std::to_string(getpid()) + "-" + std::to_string(counter_++));
        std::filesystem::create_directories(dir_);
        const std::string d_ip = hosts ? hosts->ip('d') : "127.0.0.1",
                          p_ip = hosts ? hosts->ip('p') : "127.0.0.1";
        decode_rpc_ = hosts ? 7201 : free_port();
        decode_data_ = hosts ? 7202 : free_port();
        std::ofstream yaml(config());
        yaml << "model: " << default_gguf_model() << "\n"
             << "threads: 1\nctx_size: 2048\nlocal_prefill_max: 0\n"
             << "transport: {tls: \"" << tls << "\"}\nprefill:\n";
        for (int i = 0; i < n_prefill; ++i) {
            yaml << "  - {name: p" << i << ", rpc: \"" << p_ip << ":"
                 << (hosts ? 7101 + i : free_port()) << "\"}\n";
        }
        yaml << "decode:\n  - {name: d0, rpc: \"" << d_ip << ":" << decode_rpc_ << "\", data: \""
             << d_ip << ":" << decode_data_ << "\"}\n";
        yaml.close();
        const auto node = [&](const char* role, const char* name) {
            std::vector<std::string> args = {role, "--config", config(), "--name", name};
            if (!hosts) return std::make_unique<ServingProcess>(args, "serving RPC on");
            args.insert(args.begin(), {"netns", "exec", hosts->ns(role[0]), deltaserve_binary()});
            return std::make_unique<ServingProcess>(args, "serving RPC on", hosts->ip_binary());
        };
        decode_ = node("decode", "d0");
        for (int i = 0; i < n_prefill; ++i)
            prefill_.push_back(node("prefill", ("p" + std::to_string(i)).c_str()));
        gateway_ = std::make_unique<ServingProcess>(
            std::vector<std::string>{"gateway", "--config", config(), "--port", "0"});
    }
    ~Cluster() {
        gateway_.reset();
        prefill_.clear();
        decode_.reset();
        std::filesystem::remove_all(dir_);
    }
    bool up() const {
        for (const auto& p : prefill_) {
            if (!p->ready()) return false;
        }
        return decode_->ready() && gateway_->port() != 0;
    }
    std::string logs() const {
        std::string all = decode_->log();
        for (const auto& p : prefill_) all += p->log();
        return all + gateway_->log();
    }
    std::string config() const { return (dir_ / "cluster.yaml").string(); }
    uint16_t port() const { return gateway_->port(); }
    ServingProcess& decode() { return *decode_; }
    ServingProcess& prefill(size_t i = 0) { return *prefill_[i]; }
    ServingProcess& gateway() { return *gateway_; }
    uint16_t decode_rpc() const { return decode_rpc_; }
    uint16_t decode_data() const { return decode_data_; }

    // A metric's value from /metrics.
    double metric(const std::string& name) {
        const HttpResponse r = http_request(port(), "GET", "/metrics");
        const size_t at = r.body.find("\n" + name + " ");
        return at == std::string::npos ? -1 : std::atof(r.body.c_str() + at + name.size() + 2);
    }

  private:
    static inline int counter_ = 0;
    std::filesystem::path dir_;
    uint16_t decode_rpc_ = 0, decode_data_ = 0;
    std::unique_ptr<ServingProcess> decode_, gateway_;
    std::vector<std::unique_ptr<ServingProcess>> prefill_;
};

class ClusterTest : public ::testing::Test {
  protected:
    void SetUp() override { DS_REQUIRE_FILE(default_gguf_model(), "default GGUF model"); }
};

// Over tcp, and on one host with the default transports (KV through the shared pool).
class ClusterLinkTest : public ClusterTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(ClusterLinkTest, AnswersLikeServeAndSessionsContinue) {
    Cluster cluster(nullptr, 1, GetParam());
    ASSERT_TRUE(cluster.up()) << cluster.logs();
    ServingProcess serve(serve_args({"--ctx-size", "2048"}));
    ASSERT_NE(serve.port(), 0) << serve.log();
    const uint16_t port = cluster.port();

    // Greedy answers equal the embedded mode's, whole and streamed.
    for (const char* q : {"What is the capital of France?", "Name three colours."}) {
        const HttpResponse a = post_chat(port, chat_body(q, 16));
        const HttpResponse b = post_chat(serve.port(), chat_body(q, 16));
        ASSERT_EQ(a.status, 200) << a.body;
        ASSERT_EQ(b.status, 200) << b.body;
        const std::string text = json::parse(a.body)["choices"][0]["message"]["content"];
        EXPECT_EQ(text, json::parse(b.body)["choices"][0]["message"]["content"]) << q;
        const HttpResponse s = post_chat(port, chat_body(q, 16, true));
        EXPECT_EQ(parse_sse(s.body).text, text);
    }
    EXPECT_GT(cluster.metric("deltaserve_kv_bytes_shipped_total"), 0);

    // A session: turn 2 sends only its new message; the history's KV is pulled from the decode
    // node to the prefill node, not computed again.
    expect_session_continues(port);

    // The real openai Python client against the gateway.
    if (file_exists(tools_python())) {
        const CliResult c = run_binary(
            tools_python(),
            {source_dir() + "/tests/api/openai_client_check.py", "--port", std::to_string(port)},
            "", std::chrono::seconds(300));
        EXPECT_EQ(c.exit_code, 0) << c.describe();
    }
    EXPECT_EQ(cluster.gateway().stop(), 0);
    EXPECT_EQ(cluster.prefill().stop(), 0);
    EXPECT_EQ(cluster.decode().stop(), 0);
}

// A prompt the prefill node needs a while for (1 thread).
json long_prompt(int max_tokens, bool stream = false) {
    std::string text = "Summarise this: ";
    for (int i = 0; i < 150; ++i) text += "the quick brown fox jumps over the lazy dog. ";
    return chat_body(text, max_tokens, stream);
}

TEST_P(ClusterLinkTest, APrefillNodeKilledMidTransferEndsTheRequestClearly) {
    Cluster cluster(nullptr, 1, GetParam());
    ASSERT_TRUE(cluster.up()) << cluster.logs();
    const uint16_t port = cluster.port();
    ASSERT_EQ(post_chat(port, chat_body("Hi", 2)).status, 200);
    auto pending = std::async(std::launch::async, [&] { return post_chat(port, long_prompt(8)); });
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    kill(cluster.prefill().pid(), SIGKILL);
    ASSERT_EQ(pending.wait_for(std::chrono::seconds(60)), std::future_status::ready)
        << "the request hangs";
    const HttpResponse r = pending.get();
    EXPECT_EQ(r.status, 500) << r.body;
    EXPECT_NE(r.body.find("prefill node"), std::string::npos) << r.body;
    // The gateway stays up; with no prefill node, turns that need one fail clearly; the decode
    // node holds nothing for the failed turn.
    EXPECT_EQ(http_request(port, "GET", "/health").status, 200);
    const HttpResponse again = post_chat(port, chat_body("Hi", 2));
    EXPECT_EQ(again.status, 500);
    EXPECT_NE(again.body.find("prefill"), std::string::npos) << again.body;
    EXPECT_EQ(cluster.metric("deltaserve_queue_length"), 0);
    EXPECT_EQ(cluster.metric("deltaserve_kv_bytes"), 0);
}

INSTANTIATE_TEST_SUITE_P(Tls, ClusterLinkTest, ::testing::Values("tcp", ""),
                         [](const auto& info) {
                             return std::string(*info.param ? info.param : "default");
                         });

// With a second prefill node, the gateway retries the turn there: the decode node drops the
// dead node's partial stream and takes the second one's; the answer is the one a healthy
// prefill gives.
TEST_F(ClusterTest, APrefillNodeKilledMidTransferIsRetriedOnAnother) {
    Cluster cluster(nullptr, 2);
    ASSERT_TRUE(cluster.up()) << cluster.logs();
    const uint16_t port = cluster.port();
    const HttpResponse healthy = post_chat(port, long_prompt(8));
    ASSERT_EQ(healthy.status, 200) << healthy.body;
    // Both nodes idle: the first in the config (p0) takes the next turn.
    auto pending = std::async(std::launch::async, [&] { return post_chat(port, long_prompt(8)); });
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    kill(cluster.prefill(0).pid(), SIGKILL);
    ASSERT_EQ(pending.wait_for(std::chrono::seconds(120)), std::future_status::ready)
        << "the request hangs";
    const HttpResponse r = pending.get();
    ASSERT_EQ(r.status, 200) << r.body << cluster.logs();
    EXPECT_EQ(json::parse(r.body)["choices"][0]["message"]["content"],
              json::parse(healthy.body)["choices"][0]["message"]["content"]);
    EXPECT_EQ(cluster.metric("deltaserve_prefill_retries_total"), 1)
        << "p0 finished before it was killed";
    EXPECT_EQ(cluster.metric("deltaserve_queue_length"), 0);
    EXPECT_EQ(cluster.metric("deltaserve_kv_bytes"), 0);
}

TEST_F(ClusterTest, ADecodeNodeKilledMidStreamEndsTheStreamClearly) {
    Cluster cluster;
    ASSERT_TRUE(cluster.up()) << cluster.logs();
    const uint16_t port = cluster.port();
    // Sampled at temperature 1.5, a 400-token answer rarely ends early.
    json body = chat_body("Tell me a long story.", 400, true);
    body["temperature"] = 1.5;
    body["seed"] = 7;
    auto pending = std::async(std::launch::async, [&] { return post_chat(port, body); });
    std::this_thread::sleep_for(std::chrono::milliseconds(700));
    kill(cluster.decode().pid(), SIGKILL);
    ASSERT_EQ(pending.wait_for(std::chrono::seconds(60)), std::future_status::ready)
        << "the stream hangs";
    const HttpResponse r = pending.get();
    EXPECT_NE(r.body.find("\"error\""), std::string::npos) << r.body;
    EXPECT_NE(r.body.find("[DONE]"), std::string::npos) << r.body;
    EXPECT_EQ(http_request(port, "GET", "/health").status, 200);
    const HttpResponse again = post_chat(port, chat_body("Hi", 2));
    EXPECT_EQ(again.status, 500);
    EXPECT_NE(again.body.find("decode"), std::string::npos) << again.body;
}

TEST_F(ClusterTest, GarbageOnRpcAndDataPortsHarmsNothing) {
    Cluster cluster;
    ASSERT_TRUE(cluster.up()) << cluster.logs();
    send_garbage(cluster.decode_rpc(), std::string(64, '\xff') + "not capnp");
    send_garbage(cluster.decode_data(), "GET / HTTP/1.1\r\n\r\n" + std::string(4096, 'x'));
    const HttpResponse r =
        post_chat(cluster.port(), chat_body("What is the capital of France?", 8));
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(cluster.decode().stop(), 0) << "the decode node survived";
}

// The same answers when the decode and prefill nodes are separate hosts (network namespaces
// joined by veth pairs on a bridge): RPC and UCX over real interfaces, not loopback.
TEST_F(ClusterTest, NodesInSeparateNetworkNamespacesAnswerTheSame) {
    Namespaces hosts;
    if (!hosts.available())
        GTEST_SKIP() << "cannot make network namespaces here (needs root and iproute2)";
    Cluster cluster(&hosts);
    ASSERT_TRUE(cluster.up()) << cluster.logs();
    ServingProcess serve(serve_args({"--ctx-size", "2048"}));
    ASSERT_NE(serve.port(), 0) << serve.log();
    const char* q = "What is the capital of France?";
    const HttpResponse a = post_chat(cluster.port(), chat_body(q, 16));
    const HttpResponse b = post_chat(serve.port(), chat_body(q, 16));
    ASSERT_EQ(a.status, 200) << a.body;
    EXPECT_EQ(json::parse(a.body)["choices"][0]["message"]["content"],
              json::parse(b.body)["choices"][0]["message"]["content"]);
    HttpResponse r =
        post_chat(cluster.port(), chat_body("My name is Ada.", 8), "X-Session-ID: ada\r\n");
    ASSERT_EQ(r.status, 200) << r.body;
    r = post_chat(cluster.port(), chat_body("What is my name?", 8), "X-Session-ID: ada\r\n");
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_GT(json::parse(r.body)["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(),
              10);
    EXPECT_GT(cluster.metric("deltaserve_kv_bytes_shipped_total"), 0);
}

TEST_F(ClusterTest, BadConfigsAreClearErrors) {
    const auto dir =
        std::filesystem::temp_directory_path() / ("deltaserve-badcfg-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    const auto run = [&](const std::string& yaml, const std::vector<std::string>& args) {
        std::ofstream(dir / "c.yaml") << yaml;
        std::vector<std::string> a = args;
        a.insert(a.end(), {"--config", (dir / "c.yaml").string()});
        return run_binary(deltaserve_binary(), a, "", std::chrono::seconds(30));
    };
    CliResult r = run("model: m\ndecode: []\nthreads: two\n", {"gateway"});
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("threads"), std::string::npos) << r.describe();
    r = run("model: m\nfoo: 1\n", {"gateway"});
    EXPECT_NE(r.err.find("unknown key 'foo'"), std::string::npos) << r.describe();
    r = run("model: m\ndecode:\n  - {name: d0, rpc: \"127.0.0.1:1\"}\n",
            {"decode", "--name", "d0"});
    EXPECT_NE(r.err.find("data address"), std::string::npos) << r.describe();
    r = run("model: m\ndecode:\n  - {name: d0, rpc: \"127.0.0.1:1\", data: \"127.0.0.1:2\"}\n",
            {"prefill", "--name", "p9"});
    EXPECT_NE(r.err.find("no node named p9"), std::string::npos) << r.describe();
    r = run("model: [m, n\n", {"gateway"});
    EXPECT_NE(r.err.find("not valid YAML"), std::string::npos) << r.describe();
    std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace deltaserve::testing
