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

#include "local_cluster.h"
#include "serving.h"

namespace deltaserve::testing {
namespace {

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

// Sends a chat request on a new connection; the socket, to read the answer from (-1 if the
// request could not be sent).
int send_chat(uint16_t port, const json& body) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    const std::string b = body.dump();
    const std::string req =
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/json\r\nContent-Length: " +
        std::to_string(b.size()) + "\r\n\r\n" + b;
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
        close(fd);
        return -1;
    }
    return fd;
}

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

    // Structured output: the schema travels to the prefill node (which samples the first
    // token under it) and the decode node; the answer is the embedded mode's, and valid.
    json structured = chat_body("Describe a cat as JSON.", 48);
    structured["response_format"] = {
        {"type", "json_schema"},
        {"json_schema",
         {{"name", "cat"},
          {"schema",
           {{"type", "object"},
            {"properties", {{"name", {{"type", "string"}}}, {"legs", {{"type", "integer"}}}}},
            {"required", {"name", "legs"}},
            {"additionalProperties", false}}}}}};
    const HttpResponse ca = post_chat(port, structured);
    const HttpResponse cb = post_chat(serve.port(), structured);
    ASSERT_EQ(ca.status, 200) << ca.body;
    ASSERT_EQ(cb.status, 200) << cb.body;
    const json ja = json::parse(ca.body)["choices"][0];
    EXPECT_EQ(ja["message"]["content"], json::parse(cb.body)["choices"][0]["message"]["content"]);
    if (ja["finish_reason"] == "stop") {
        const json v = json::parse(ja["message"]["content"].get<std::string>());
        EXPECT_TRUE(v["name"].is_string() && v["legs"].is_number_integer()) << v.dump();
    }

    // Log-probabilities: the first token's from the prefill node (with its KV), the rest
    // from the decode node over the gateway's sink; the embedded mode's, up to rounding.
    json with_logprobs = chat_body("Name three colours.", 6);
    with_logprobs["logprobs"] = true;
    with_logprobs["top_logprobs"] = 3;
    const HttpResponse la = post_chat(port, with_logprobs);
    const HttpResponse lb = post_chat(serve.port(), with_logprobs);
    ASSERT_EQ(la.status, 200) << la.body;
    ASSERT_EQ(lb.status, 200) << lb.body;
    const json ea = json::parse(la.body)["choices"][0]["logprobs"]["content"];
    const json eb = json::parse(lb.body)["choices"][0]["logprobs"]["content"];
    ASSERT_EQ(ea.size(), eb.size()) << la.body;
    for (size_t i = 0; i < ea.size(); ++i) {
        EXPECT_EQ(ea[i]["token"], eb[i]["token"]) << i;
        EXPECT_NEAR(ea[i]["logprob"].get<double>(), eb[i]["logprob"].get<double>(), 5e-3) << i;
        EXPECT_EQ(ea[i]["top_logprobs"].size(), 3u) << i;
    }

    // A prompt's log-probabilities (lm-eval's loglikelihood): the decode node computes the
    // whole prompt itself and sends each token's over the gateway's sink; as embedded.
    const json scored = {{"prompt", "The capital of France is Paris."},
                         {"max_tokens", 1},
                         {"temperature", 0},
                         {"echo", true},
                         {"logprobs", 1},
                         {"prompt_logprobs", 2}};
    const HttpResponse pa = http_request(port, "POST", "/v1/completions", scored.dump());
    const HttpResponse pb = http_request(serve.port(), "POST", "/v1/completions", scored.dump());
    ASSERT_EQ(pa.status, 200) << pa.body;
    ASSERT_EQ(pb.status, 200) << pb.body;
    const json sa = json::parse(pa.body)["choices"][0], sb = json::parse(pb.body)["choices"][0];
    ASSERT_EQ(sa["logprobs"]["tokens"], sb["logprobs"]["tokens"]);
    ASSERT_EQ(sa["prompt_logprobs"].size(), sb["prompt_logprobs"].size());
    EXPECT_TRUE(sa["logprobs"]["token_logprobs"][0].is_null());
    for (size_t i = 1; i < sa["prompt_logprobs"].size(); ++i) {
        EXPECT_NEAR(sa["logprobs"]["token_logprobs"][i].get<double>(),
                    sb["logprobs"]["token_logprobs"][i].get<double>(), 5e-3)
            << i;
        EXPECT_EQ(sa["prompt_logprobs"][i].size(), sb["prompt_logprobs"][i].size()) << i;
    }

    // n choices: the decode node tells the gateway when choice 0's prompt is in (over RPC),
    // and the others start then; greedy, each is the embedded mode's one answer.
    json three = chat_body("Name three colours.", 6);
    three["n"] = 3;
    const HttpResponse na = post_chat(port, three);
    const HttpResponse nb = post_chat(serve.port(), chat_body("Name three colours.", 6));
    ASSERT_EQ(na.status, 200) << na.body;
    ASSERT_EQ(nb.status, 200) << nb.body;
    const json choices = json::parse(na.body)["choices"];
    ASSERT_EQ(choices.size(), 3u) << na.body;
    for (size_t i = 0; i < 3; ++i) {
        EXPECT_EQ(choices[i]["message"]["content"],
                  json::parse(nb.body)["choices"][0]["message"]["content"])
            << i;
    }

    // A session: turn 2 sends only its new message; the history's KV is pulled from the decode
    // node to the prefill node, not computed again.
    expect_session_continues(port);
    expect_resent_conversation_is_cached(port);

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

// A prompt the prefill node needs a while for (1 thread): ~1500 tokens. Another subject makes
// another prompt, which shares no cached block with the first.
json long_prompt(int max_tokens, bool stream = false, const std::string& subject = "fox") {
    std::string text = "Summarise this: ";
    for (int i = 0; i < 150; ++i)
        text += "the quick brown " + subject + " jumps over the lazy dog. ";
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
    EXPECT_EQ(r.status, 503) << r.body;
    EXPECT_EQ(r.headers.count("retry-after"), 1u);
    EXPECT_NE(r.body.find("prefill node"), std::string::npos) << r.body;
    // The gateway stays up; with no prefill node, turns that need one fail clearly; the decode
    // node holds nothing for the failed turn.
    EXPECT_EQ(http_request(port, "GET", "/health").status, 200);
    const HttpResponse again = post_chat(port, chat_body("Hi", 2));
    EXPECT_EQ(again.status, 503);
    EXPECT_NE(again.body.find("prefill"), std::string::npos) << again.body;
    EXPECT_EQ(cluster.metric("deltaserve_queue_length"), 0);
    EXPECT_EQ(cluster.metric("deltaserve_kv_bytes"), 0);
}

INSTANTIATE_TEST_SUITE_P(Tls, ClusterLinkTest, ::testing::Values("tcp", ""), [](const auto& info) {
    return std::string(*info.param ? info.param : "default");
});

// With a second prefill node, the gateway retries the turn there: the decode node drops the
// dead node's partial stream and takes the second one's; the answer is the one a healthy
// prefill gives.
TEST_F(ClusterTest, APrefillNodeKilledMidTransferIsRetriedOnAnother) {
    // The answer a healthy cluster gives, from one of its own: in the cluster below, the
    // retried turn's blocks are cached, and a second request would reuse them.
    json expected;
    {
        Cluster healthy_cluster;
        ASSERT_TRUE(healthy_cluster.up()) << healthy_cluster.logs();
        const HttpResponse healthy =
            post_chat(healthy_cluster.port(), long_prompt(8, false, "cat"));
        ASSERT_EQ(healthy.status, 200) << healthy.body << healthy_cluster.logs();
        expected = json::parse(healthy.body)["choices"][0]["message"]["content"];
    }
    Cluster cluster(nullptr, 2);
    ASSERT_TRUE(cluster.up()) << cluster.logs();
    const uint16_t port = cluster.port();
    ASSERT_EQ(post_chat(port, long_prompt(8)).status, 200) << cluster.logs();
    // Both nodes idle: the first in the config (p0) takes the next turn. Another prompt, so
    // that no cached prefix makes its prefill too short to be killed in.
    auto pending = std::async(std::launch::async,
                              [&] { return post_chat(port, long_prompt(8, false, "cat")); });
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    kill(cluster.prefill(0).pid(), SIGKILL);
    ASSERT_EQ(pending.wait_for(std::chrono::seconds(120)), std::future_status::ready)
        << "the request hangs";
    const HttpResponse r = pending.get();
    ASSERT_EQ(r.status, 200) << r.body << cluster.logs();
    EXPECT_EQ(cluster.metric("deltaserve_prefill_retries_total"), 1)
        << "p0 finished before it was killed";
    EXPECT_EQ(json::parse(r.body)["choices"][0]["message"]["content"], expected);
    EXPECT_EQ(cluster.metric("deltaserve_queue_length"), 0);
    EXPECT_EQ(cluster.metric("deltaserve_kv_bytes"), 0);
}

// A client that leaves while the prefill node computes its prompt stops that prefill there
// (the gateway tells the node over RPC): nothing runs on for it, and nothing stays held.
TEST_F(ClusterTest, AClientThatLeavesMidPrefillStopsThePrefillNode) {
    Cluster cluster;
    ASSERT_TRUE(cluster.up()) << cluster.logs();
    const uint16_t port = cluster.port();
    const double tokens = cluster.metric("deltaserve_prefill_tokens_total");
    const int fd = send_chat(port, long_prompt(8, true));
    ASSERT_GE(fd, 0) << "could not send the request";
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (cluster.metric("deltaserve_queue_length") == 0 &&
           std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_GT(cluster.metric("deltaserve_queue_length"), 0) << "the prefill never began";
    close(fd);
    double queued = -1;
    for (int i = 0; i < 600 && queued != 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        queued = cluster.metric("deltaserve_queue_length");
    }
    EXPECT_EQ(queued, 0) << cluster.logs();
    EXPECT_EQ(cluster.metric("deltaserve_prefill_tokens_total"), tokens)
        << "the prefill node went on for a client that left";
    EXPECT_EQ(cluster.metric("deltaserve_kv_bytes"), 0);
    const HttpResponse r = post_chat(port, long_prompt(2));
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_GT(cluster.metric("deltaserve_prefill_tokens_total"), tokens);
}

TEST_F(ClusterTest, ADecodeNodeKilledMidStreamEndsTheStreamClearly) {
    Cluster cluster;
    ASSERT_TRUE(cluster.up()) << cluster.logs();
    const uint16_t port = cluster.port();
    // Sampled at temperature 1.5, a 400-token answer rarely ends early.
    json body = chat_body("Tell me a long story.", 400, true);
    body["temperature"] = 1.5;
    body["seed"] = 7;
    // Killed once the stream has begun (its first piece arrived).
    const int fd = send_chat(port, body);
    ASSERT_GE(fd, 0) << "could not send the request";
    std::string raw;
    char buf[4096];
    bool killed = false;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < until) {
        pollfd p{fd, POLLIN, 0};
        if (poll(&p, 1, 1000) <= 0) continue;
        const ssize_t n = read(fd, buf, sizeof buf);
        if (n <= 0) break;
        raw.append(buf, static_cast<size_t>(n));
        if (!killed && raw.find("data: ") != std::string::npos) {
            kill(cluster.decode().pid(), SIGKILL);
            killed = true;
        }
    }
    close(fd);
    ASSERT_TRUE(killed) << "the stream never began: " << raw;
    const HttpResponse r = parse_http_response(raw);
    EXPECT_EQ(r.status, 200) << raw;
    EXPECT_NE(r.body.find("\"error\""), std::string::npos) << r.body;
    EXPECT_NE(r.body.find("[DONE]"), std::string::npos) << r.body;
    EXPECT_EQ(http_request(port, "GET", "/health").status, 200);
    const HttpResponse again = post_chat(port, chat_body("Hi", 2));
    EXPECT_EQ(again.status, 503);
    EXPECT_NE(again.body.find("decode"), std::string::npos) << again.body;
}

// A gateway killed mid-turn: the decode node ends the turn nobody will read (and frees its
// KV) at once, rather than generating to the end; another gateway takes over the nodes.
TEST_F(ClusterTest, AGatewayKilledMidTurnEndsItsTurnOnTheDecodeNode) {
    Cluster cluster;
    ASSERT_TRUE(cluster.up()) << cluster.logs();
    // Greedy, this answer runs to its 1500 tokens: half a minute on one thread.
    const json body = chat_body("Write the numbers from 1 to 500 separated by commas.", 1500, true);
    const int fd = send_chat(cluster.port(), body);
    ASSERT_GE(fd, 0) << "could not send the request";
    std::string raw;
    char buf[4096];
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (raw.find("data: ") == std::string::npos && std::chrono::steady_clock::now() < until) {
        pollfd p{fd, POLLIN, 0};
        if (poll(&p, 1, 1000) <= 0) continue;
        const ssize_t n = read(fd, buf, sizeof buf);
        if (n <= 0) break;
        raw.append(buf, static_cast<size_t>(n));
    }
    ASSERT_NE(raw.find("data: "), std::string::npos) << "the stream never began: " << raw;
    kill(cluster.gateway().pid(), SIGKILL);
    const auto killed_at = std::chrono::steady_clock::now();
    close(fd);
    ASSERT_TRUE(cluster.restart_gateway()) << cluster.logs();
    double kv = -1;
    while (std::chrono::steady_clock::now() - killed_at < std::chrono::seconds(4)) {
        kv = cluster.metric("deltaserve_kv_bytes");
        if (kv == 0) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_EQ(kv, 0) << "the decode node still runs the dead gateway's turn";
    const HttpResponse r = post_chat(cluster.port(), chat_body("Hello", 4));
    EXPECT_EQ(r.status, 200) << r.body;
}

// The whole cluster killed (-9) and started again on its data_dir: the gateway reads its
// session records back, the decode node its stored KV, and the session's next turn resumes
// from disk with its whole history.
TEST_F(ClusterTest, ASessionSurvivesTheWholeClusterKilledAndRestarted) {
    Cluster cluster;
    ASSERT_TRUE(cluster.up()) << cluster.logs();
    ASSERT_EQ(open_session(cluster.port(), "ada"), 200);
    const auto ask = [&](const std::string& m) {
        return post_chat(cluster.port(), chat_body(m, 12), "X-Session-ID: ada\r\n");
    };
    HttpResponse r = ask("My name is Ada and I keep bees. Say hello to me.");
    ASSERT_EQ(r.status, 200) << r.body;
    const std::string hello = json::parse(r.body)["choices"][0]["message"]["content"];
    kill(cluster.gateway().pid(), SIGKILL);
    cluster.decode().kill9();
    ASSERT_TRUE(cluster.restart_decode()) << cluster.logs();
    ASSERT_TRUE(cluster.restart_gateway()) << cluster.logs();
    EXPECT_NE(cluster.gateway().log().find("1 sessions recovered in"), std::string::npos)
        << cluster.logs();
    const HttpResponse info = http_request(cluster.port(), "GET", "/v1/sessions/ada");
    ASSERT_EQ(info.status, 200) << info.body;
    EXPECT_EQ(json::parse(info.body)["turns"], 1);
    r = ask("What is my name?");
    ASSERT_EQ(r.status, 200) << r.body;
    const json second = json::parse(r.body);
    EXPECT_EQ(second["usage"]["prompt_tokens_details"]["kv_source"], "disk") << r.body;
    EXPECT_GT(second["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 30) << r.body;
    // Its prompt is the whole conversation: the same answer as the conversation sent whole.
    json whole = chat_body("", 12);
    whole["messages"] = json::array(
        {{{"role", "user"}, {"content", "My name is Ada and I keep bees. Say hello to me."}},
         {{"role", "assistant"}, {"content", hello}},
         {{"role", "user"}, {"content", "What is my name?"}}});
    const HttpResponse w = post_chat(cluster.port(), whole);
    ASSERT_EQ(w.status, 200) << w.body;
    EXPECT_EQ(second["choices"][0]["message"]["content"],
              json::parse(w.body)["choices"][0]["message"]["content"]);
    EXPECT_EQ(second["usage"]["prompt_tokens"], json::parse(w.body)["usage"]["prompt_tokens"]);

    // An operator sees it through the gateway's admin service (its decode node asked over
    // RPC), and, once the cluster stopped, in the data dir: the same session, on d0.
    const CliResult live =
        run_binary(deltactl_binary(), {"sessions", "--server", cluster.gateway_rpc(), "--admin-key",
                                       Cluster::kAdminKey, "--json"});
    ASSERT_EQ(live.exit_code, 0) << live.describe() << cluster.logs();
    const json rows = json::parse(live.out);
    ASSERT_EQ(rows.size(), 1u) << live.out;
    EXPECT_EQ(rows[0]["id"], "ada");
    EXPECT_EQ(rows[0]["node"], "d0");
    EXPECT_EQ(rows[0]["turns"], 2);
    EXPECT_EQ(rows[0]["policy"], "full");
    EXPECT_GT(rows[0]["disk_bytes"].get<int64_t>(), 0) << live.out;
    EXPECT_EQ(rows[0]["decode_tokens"], rows[0]["stored_tokens"]) << live.out;
    const CliResult tiers = run_binary(
        deltactl_binary(),
        {"tiers", "--server", cluster.gateway_rpc(), "--admin-key", Cluster::kAdminKey, "--json"});
    ASSERT_EQ(tiers.exit_code, 0) << tiers.describe();
    EXPECT_EQ(json::parse(tiers.out)[0]["node"], "d0") << tiers.out;
    // The cluster's shape, found from its config alone (gateway.rpc, admin_key).
    const CliResult shape =
        run_binary(deltactl_binary(), {"cluster", "--config", cluster.config(), "--json"});
    ASSERT_EQ(shape.exit_code, 0) << shape.describe();
    const json c = json::parse(shape.out);
    EXPECT_EQ(c["gateway"]["version"], c["decode"][0]["version"]) << shape.out;
    EXPECT_EQ(c["decode"][0]["name"], "d0");
    EXPECT_EQ(c["decode"][0]["ok"], true);
    EXPECT_EQ(c["decode"][0]["rpc_address"], "127.0.0.1:" + std::to_string(cluster.decode_rpc()));
    EXPECT_EQ(c["decode"][0]["data_address"], "127.0.0.1:" + std::to_string(cluster.decode_data()));
    EXPECT_EQ(c["decode"][0]["sessions"], 1);
    ASSERT_EQ(c["prefill"].size(), 1u) << shape.out;
    EXPECT_EQ(c["prefill"][0]["name"], "p0");
    EXPECT_EQ(c["prefill"][0]["ok"], true);
    EXPECT_FALSE(c["prefill"][0]["version"].get<std::string>().empty());
    // A checkpoint of every store, read offline while the cluster runs.
    const CliResult cp =
        run_binary(deltactl_binary(), {"checkpoint", "--config", cluster.config(), "--name", "cp"});
    ASSERT_EQ(cp.exit_code, 0) << cp.describe();
    const CliResult copy =
        run_binary(deltactl_binary(),
                   {"sessions", "--data-dir", cluster.data_dir() + "/checkpoints/cp", "--json"});
    ASSERT_EQ(copy.exit_code, 0) << copy.describe();
    EXPECT_EQ(json::parse(copy.out)[0]["node"], "d0") << copy.out;
    EXPECT_EQ(json::parse(copy.out)[0]["turns"], 2) << copy.out;
    // An operator's evict, through the gateway to the decode node over RPC: ada's KV leaves
    // decode memory and stays in the tiers.
    const CliResult evict =
        run_binary(deltactl_binary(), {"evict", "ada", "--config", cluster.config()});
    ASSERT_EQ(evict.exit_code, 0) << evict.describe() << cluster.logs();
    const CliResult after =
        run_binary(deltactl_binary(), {"sessions", "--config", cluster.config(), "--json"});
    ASSERT_EQ(after.exit_code, 0) << after.describe();
    EXPECT_TRUE(json::parse(after.out)[0]["decode_bytes"].is_null()) << after.out;
    EXPECT_GT(json::parse(after.out)[0]["host_bytes"].get<int64_t>(), 0) << after.out;
    EXPECT_EQ(cluster.gateway().stop(), 0);
    EXPECT_EQ(cluster.decode().stop(), 0);
    const CliResult offline =
        run_binary(deltactl_binary(), {"sessions", "--data-dir", cluster.data_dir(), "--json"});
    ASSERT_EQ(offline.exit_code, 0) << offline.describe();
    const json stored = json::parse(offline.out);
    ASSERT_EQ(stored.size(), 1u) << offline.out;
    EXPECT_EQ(stored[0]["node"], "d0");
    EXPECT_EQ(stored[0]["turns"], 2);
    EXPECT_EQ(stored[0]["disk_bytes"], rows[0]["disk_bytes"]);
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

// Nodes ask for the cluster token: a gateway with another one is refused on RPC (and says
// so), a KV peer that does not prove it is dropped and logged, and without a token a node
// does not serve a non-loopback address.
TEST_F(ClusterTest, PeersWithoutTheClusterTokenAreRefused) {
    Cluster cluster;
    ASSERT_TRUE(cluster.up()) << cluster.logs();
    std::string yaml;
    {
        std::ifstream in(cluster.config());
        yaml.assign(std::istreambuf_iterator<char>(in), {});
    }
    const auto other = std::filesystem::path(cluster.config()).parent_path() / "other.yaml";
    const std::string mark = "cluster_token: cluster-test-secret";
    ASSERT_NE(yaml.find(mark), std::string::npos);
    std::ofstream(other) << yaml.replace(yaml.find(mark), mark.size(), "cluster_token: guessed");
    CliResult r =
        run_binary(deltaserve_binary(), {"gateway", "--config", other.string(), "--port", "0"}, "",
                   std::chrono::seconds(60));
    EXPECT_EQ(r.exit_code, 1) << r.describe();
    EXPECT_NE(r.err.find("cluster token"), std::string::npos) << r.describe();
    EXPECT_NE(cluster.decode().read_log().find("did not prove the cluster token"),
              std::string::npos)
        << cluster.decode().log();

    send_garbage(cluster.decode_data(), "not a proof");
    const HttpResponse ok = post_chat(cluster.port(), chat_body("Hello", 4));
    EXPECT_EQ(ok.status, 200) << ok.body;

    std::ofstream(other) << "model: m\ndecode:\n  - {name: d0, rpc: \"0.0.0.0:1\", data: "
                            "\"0.0.0.0:2\"}\n";
    r = run_binary(deltaserve_binary(), {"decode", "--config", other.string(), "--name", "d0"}, "",
                   std::chrono::seconds(30));
    EXPECT_EQ(r.exit_code, 2) << r.describe();
    EXPECT_NE(r.err.find("without a cluster token"), std::string::npos) << r.describe();
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
