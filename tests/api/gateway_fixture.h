// The HTTP gateway in process for tests, on the default model with a decode and a prefill
// worker (as `deltaserve serve` runs them), and raw sockets to speak to it.
#pragma once

#include <dirent.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <future>
#include <string>
#include <thread>
#include <vector>

#include "default_model.h"
#include "deltaserve/api/cluster_chat_engine.h"
#include "deltaserve/api/http_gateway.h"
#include "deltaserve/decode/decode_worker.h"
#include "deltaserve/prefill/prefill_worker.h"
#include "deltaserve/transport/transport_factory.h"
#include "http_client.h"
#include "test_paths.h"

namespace deltaserve::testing {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

inline int thread_count() {
    int n = 0;
    if (DIR* d = opendir("/proc/self/task")) {
        while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
        closedir(d);
    }
    return n;
}

// A socket to the gateway that sends `bytes` and stays open until destroyed.
class RawClient {
  public:
    // receive_buffer > 0: the socket's SO_RCVBUF, set before connecting (a client whose
    // kernel takes little of what it does not read).
    RawClient(uint16_t port, const std::string& bytes, int receive_buffer = 0) {
        fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (receive_buffer > 0) {
            setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof receive_buffer);
        }
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(port);
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return;
        if (!bytes.empty()) (void)!send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    }
    ~RawClient() { close(fd_); }
    // What arrives within timeout_ms, until the server closes ("" if nothing).
    std::string read_all(int timeout_ms) {
        std::string out;
        char buf[4096];
        const auto until = Clock::now() + std::chrono::milliseconds(timeout_ms);
        for (;;) {
            const int left = static_cast<int>(
                std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now())
                    .count());
            pollfd p{fd_, POLLIN, 0};
            if (left <= 0 || poll(&p, 1, left) <= 0) return out;
            const ssize_t n = recv(fd_, buf, sizeof buf, 0);
            if (n <= 0) {
                closed_ = true;
                return out;
            }
            out.append(buf, static_cast<size_t>(n));
        }
    }
    // What arrives until `needle` is in it, the server closes or timeout_ms passes.
    std::string read_until(const std::string& needle, int timeout_ms) {
        std::string out;
        char buf[4096];
        const auto until = Clock::now() + std::chrono::milliseconds(timeout_ms);
        while (out.find(needle) == std::string::npos) {
            const int left = static_cast<int>(
                std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now())
                    .count());
            pollfd p{fd_, POLLIN, 0};
            if (left <= 0 || poll(&p, 1, left) <= 0) break;
            const ssize_t n = recv(fd_, buf, sizeof buf, 0);
            if (n <= 0) {
                closed_ = true;
                break;
            }
            out.append(buf, static_cast<size_t>(n));
        }
        return out;
    }
    void send_more(const std::string& bytes) {
        (void)!send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    }
    bool closed_by_server() const { return closed_; }

  private:
    int fd_ = -1;
    bool closed_ = false;
};

// The responses in `raw`, one after another (each framed by Content-Length or chunked; a
// response without either ends with the bytes). Stops at the first that is not whole.
inline std::vector<HttpResponse> split_responses(const std::string& raw) {
    std::vector<HttpResponse> out;
    size_t at = 0;
    while (at < raw.size()) {
        const size_t head_end = raw.find("\r\n\r\n", at);
        if (head_end == std::string::npos) break;
        const HttpResponse head = parse_http_response(raw.substr(at, head_end + 4 - at));
        if (head.status == 0) break;
        size_t end = raw.size();
        if (head.headers.count("content-length")) {
            end = head_end + 4 + std::stoul(head.headers.at("content-length"));
        } else if (head.headers.count("transfer-encoding")) {
            const size_t last = raw.find("\r\n0\r\n\r\n", head_end);
            if (last == std::string::npos) break;
            end = last + 7;
        }
        if (end > raw.size()) break;
        out.push_back(parse_http_response(raw.substr(at, end - at)));
        at = end;
    }
    return out;
}

inline std::string post(const json& body, const std::string& extra_headers = "") {
    const std::string b = body.dump();
    return "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
           "Content-Type: application/json\r\n" +
           extra_headers + "Content-Length: " + std::to_string(b.size()) + "\r\n\r\n" + b;
}

inline json chat(const std::string& user, int max_tokens, bool stream = false) {
    return {{"messages", json::array({{{"role", "user"}, {"content", user}}})},
            {"max_tokens", max_tokens},
            {"temperature", 0},
            {"stream", stream}};
}

class HttpGatewayTest : public ::testing::Test {
  protected:
    static void SetUpTestSuite() { model_ = load_default_model(); }
    static void TearDownTestSuite() {
        delete model_;
        model_ = nullptr;
    }
    void SetUp() override {
        DS_REQUIRE_FILE(default_gguf_model(), "default GGUF model");
        ASSERT_NE(model_, nullptr);
        transport_ = std::move(*transport::make_transport("inproc", {}));
        decode::DecodeOptions d;
        d.context.n_ctx = 1024;
        d.context.n_threads = 1;
        d.threads = 1;
        d.model_id = "m";
        decode_ = std::move(*decode::DecodeWorker::create(*model_, d));
        prefill::PrefillOptions p;
        p.context = d.context;
        p.context.n_batch = 64;  // a cancelled prefill stops within 64 tokens
        p.model_id = "m";
        prefill_ = std::move(*prefill::PrefillWorker::create(*model_, p, *transport_));
        const std::string address = *decode_->listen(*transport_, "decode-0");
        decode_node_ = api::local_decode_node("decode-0", *decode_, address);
        prefill_node_ = api::local_prefill_node("prefill-0", *prefill_);
        engine_ = std::make_unique<api::ClusterChatEngine>(
            *model_, "m", std::vector<api::DecodeNode*>{decode_node_.get()},
            std::vector<api::PrefillNode*>{prefill_node_.get()}, api::ClusterEngineOptions{});
    }
    void TearDown() override {
        if (gateway_) gateway_->stop();
    }

    uint16_t start(api::GatewayOptions o) {
        o.port = 0;
        auto g = api::HttpGateway::start(*engine_, o);
        EXPECT_TRUE(g.ok()) << g.error().message();
        gateway_ = std::move(*g);
        return gateway_->port();
    }

    // Waits for the prefill worker to have `n` prefills queued or running; false after
    // timeout_ms.
    bool prefills_within(int64_t n, int timeout_ms) {
        const auto until = Clock::now() + std::chrono::milliseconds(timeout_ms);
        while (Clock::now() < until) {
            if (prefill_->stats().queued == n) return true;
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        return false;
    }

    // Waits for the decode worker to have no turn running; false after timeout_ms.
    bool turns_end_within(int timeout_ms) {
        const auto until = Clock::now() + std::chrono::milliseconds(timeout_ms);
        while (Clock::now() < until) {
            const auto s = decode_->stats();
            if (s.running == 0 && s.waiting == 0) return true;
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        return false;
    }

    static inline model::Model* model_ = nullptr;
    std::unique_ptr<transport::Transport> transport_;
    std::unique_ptr<decode::DecodeWorker> decode_;
    std::unique_ptr<prefill::PrefillWorker> prefill_;
    std::unique_ptr<api::DecodeNode> decode_node_;
    std::unique_ptr<api::PrefillNode> prefill_node_;
    std::unique_ptr<api::ClusterChatEngine> engine_;
    std::unique_ptr<api::HttpGateway> gateway_;
};

}  // namespace deltaserve::testing
