// The gateway's HTTP request path, bytes in, response out: one gateway (the asynchronous
// HttpGateway over a ClusterChatEngine with a decode and a prefill worker on the default
// model, as `deltaserve serve` runs them, with an API key) takes each input on a fresh
// connection. Whatever the bytes, the answer is nothing or an HTTP/1.1 response that is
// not a 500 (nothing a client sends is the server's fault), and the gateway answers the
// next connection. Turns are short: the client half-closes after its bytes, which cancels
// a running turn at its next step.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "deltaserve/api/cluster_chat_engine.h"
#include "deltaserve/api/http_gateway.h"
#include "deltaserve/decode/decode_worker.h"
#include "deltaserve/model/model.h"
#include "deltaserve/prefill/prefill_worker.h"
#include "deltaserve/transport/transport_factory.h"
#include "fuzz_support.h"

using namespace deltaserve;

namespace {

// The default model, where setup puts it (DELTASERVE_MODELS_DIR, else models/ here).
std::string model_path() {
    const char* dir = std::getenv("DELTASERVE_MODELS_DIR");
    return std::string(dir != nullptr ? dir : "models") + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

struct Server {
    std::unique_ptr<model::Model> model;
    std::unique_ptr<transport::Transport> transport;
    std::unique_ptr<decode::DecodeWorker> decode;
    std::unique_ptr<prefill::PrefillWorker> prefill;
    std::unique_ptr<api::DecodeNode> decode_node;
    std::unique_ptr<api::PrefillNode> prefill_node;
    std::unique_ptr<api::ClusterChatEngine> engine;
    std::unique_ptr<api::HttpGateway> gateway;

    Server() {
        fuzz::quiet_logs();
        auto m = model::load_model(model_path(), {});
        if (!m.ok()) {
            std::fprintf(stderr, "http_gateway_fuzzer: %s (run deploy/setup.sh)\n",
                         m.error().message().c_str());
            std::exit(1);
        }
        model = std::move(*m);
        transport = std::move(*transport::make_transport("inproc", {}));
        decode::DecodeOptions d;
        d.context.n_ctx = 512;
        d.context.n_threads = 1;
        d.threads = 1;
        d.model_id = "m";
        decode = std::move(*decode::DecodeWorker::create(*model, d));
        prefill::PrefillOptions p;
        p.context = d.context;
        p.model_id = "m";
        prefill = std::move(*prefill::PrefillWorker::create(*model, p, *transport));
        const std::string address = *decode->listen(*transport, "decode-0");
        decode_node = api::local_decode_node("decode-0", *decode, address);
        prefill_node = api::local_prefill_node("prefill-0", *prefill);
        engine = std::make_unique<api::ClusterChatEngine>(
            *model, "m", std::vector<api::DecodeNode*>{decode_node.get()},
            std::vector<api::PrefillNode*>{prefill_node.get()}, api::ClusterEngineOptions{});
        api::GatewayOptions o;
        o.port = 0;
        o.default_max_tokens = 4;
        o.header_timeout_ms = o.body_timeout_ms = 500;
        o.access.api_keys = {"fuzz-key"};
        gateway = std::move(*api::HttpGateway::start(*engine, o));
    }
};

Server& server() {
    static Server* s = new Server();  // lives to the end: the gateway's threads use it
    return *s;
}

// Sends the bytes, half-closes, and reads until the server closes (or 5 s pass).
std::string exchange(uint16_t port, const uint8_t* data, size_t size) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) std::abort();  // it died
    size_t sent = 0;
    while (sent < size) {
        const ssize_t n = send(fd, data + sent, size - sent, MSG_NOSIGNAL);
        if (n <= 0) break;  // the server answered and closed early: fine
        sent += static_cast<size_t>(n);
    }
    shutdown(fd, SHUT_WR);
    std::string out;
    char buf[16384];
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < until) {
        pollfd p{fd, POLLIN, 0};
        if (poll(&p, 1, 100) <= 0) continue;
        const ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n <= 0) break;
        out.append(buf, static_cast<size_t>(n));
    }
    close(fd);
    return out;
}

}  // namespace

// The model loads and the gateway starts here, outside the per-input timeout.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
    (void)server();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const uint16_t port = server().gateway->port();
    const std::string out = exchange(port, data, size);
    // Every response on the connection (keep-alive, pipelining) is HTTP and no 500.
    for (size_t at = out.find("HTTP/1.1 "); at != std::string::npos;
         at = out.find("HTTP/1.1 ", at + 9)) {
        if (out.compare(at + 9, 3, "500") == 0) {
            std::fprintf(stderr, "a 500 for a client's bytes:\n%s\n", out.c_str());
            std::abort();
        }
    }
    if (!out.empty() && out.rfind("HTTP/1.1 ", 0) != 0) std::abort();
    return 0;
}
