// Serving processes in tests: a deltaserve server as a child process, and the HTTP requests
// and answers of the OpenAI chat API.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>

#include "cli_runner.h"
#include "http_client.h"
#include "test_paths.h"

namespace deltaserve::testing {

using json = nlohmann::json;
namespace d = cli_runner_detail;

// `deltaserve serve` on a free port, one thread, a 1024-token context (unless they give
// --ctx-size: a flag may be given once), and more flags; no data dir unless they give one
// (tests run side by side, and one data dir is one server's).
inline std::vector<std::string> serve_args(const std::vector<std::string>& more) {
    std::vector<std::string> args = {"serve",     "--model", default_gguf_model(), "--port", "0",
                                     "--threads", "1"};
    if (std::find(more.begin(), more.end(), "--ctx-size") == more.end()) {
        args.insert(args.end(), {"--ctx-size", "1024"});
    }
    if (std::find(more.begin(), more.end(), "--data-dir") == more.end()) {
        args.insert(args.end(), {"--data-dir", "none"});
    }
    args.insert(args.end(), more.begin(), more.end());
    return args;
}

// A deltaserve process that serves (serve, gateway, prefill, decode), spoken to while it runs.
// It is ready once its stderr shows `ready` (and a newline after it); for an HTTP server the
// port follows "http://127.0.0.1:".
class ServingProcess {
  public:
    explicit ServingProcess(const std::vector<std::string>& args,
                            const std::string& ready = "http://127.0.0.1:",
                            const std::string& program = deltaserve_binary()) {
        if (!in_.open() || !out_.open() || !err_.open()) return;
        pid_ = d::spawn(program, args, in_, out_, err_, r_);
        in_.close_end(0);
        out_.close_end(1);
        err_.close_end(1);
        if (pid_ < 0) return;
        const auto deadline = d::Clock::now() + std::chrono::seconds(60);
        char buf[4096];
        while (!ready_ && d::Clock::now() < deadline) {
            pollfd p{err_.fd[0], POLLIN, 0};
            if (poll(&p, 1, 1000) <= 0) continue;
            const ssize_t n = read(err_.fd[0], buf, sizeof buf);
            if (n <= 0) break;
            log_.append(buf, static_cast<size_t>(n));
            const size_t at = log_.find(ready);
            if (at != std::string::npos && log_.find('\n', at) != std::string::npos) {
                ready_ = true;
                port_ = static_cast<uint16_t>(std::atoi(log_.c_str() + at + ready.size()));
            }
        }
        // From here a thread drains stderr: a process that logs much never blocks on a full
        // pipe (in a soak, say).
        drainer_ = std::thread([this] { drain(); });
    }
    ~ServingProcess() {
        stop();
        draining_ = false;
        if (drainer_.joinable()) drainer_.join();
    }

    uint16_t port() const { return port_; }
    bool ready() const { return ready_; }
    pid_t pid() const { return pid_; }
    // What it wrote to stderr so far (its last MiB).
    std::string log() const {
        std::lock_guard<std::mutex> lock(log_mu_);
        return log_;
    }
    // The same, after waiting up to wait_ms for something new.
    std::string read_log(int wait_ms = 500) {
        const size_t before = log().size();
        const auto until = d::Clock::now() + std::chrono::milliseconds(wait_ms);
        while (log().size() == before && d::Clock::now() < until) {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        return log();
    }

    // SIGKILL, as a crash or the OOM killer ends it: nothing of it runs after this.
    void kill9() {
        if (pid_ <= 0) return;
        kill(pid_, SIGKILL);
        int status = 0;
        waitpid(pid_, &status, 0);
        pid_ = -1;
    }

    // SIGTERM, then the exit status (-1 if it had to be killed after 30 s).
    int stop() {
        if (pid_ <= 0) return exit_code_;
        kill(pid_, SIGTERM);
        const auto deadline = d::Clock::now() + std::chrono::seconds(30);
        int status = 0;
        while (waitpid(pid_, &status, WNOHANG) == 0) {
            if (d::Clock::now() > deadline) {
                kill(pid_, SIGKILL);
                waitpid(pid_, &status, 0);
                pid_ = -1;
                return exit_code_ = -1;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        pid_ = -1;
        return exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }

  private:
    void drain() {
        char buf[4096];
        while (draining_) {
            pollfd p{err_.fd[0], POLLIN, 0};
            if (poll(&p, 1, 100) <= 0) continue;
            const ssize_t n = read(err_.fd[0], buf, sizeof buf);
            if (n <= 0) return;
            std::lock_guard<std::mutex> lock(log_mu_);
            log_.append(buf, static_cast<size_t>(n));
            if (log_.size() > (size_t{2} << 20)) log_.erase(0, log_.size() - (size_t{1} << 20));
        }
    }

    d::Pipe in_, out_, err_;
    CliResult r_;
    pid_t pid_ = -1;
    uint16_t port_ = 0;
    bool ready_ = false;
    int exit_code_ = -1;
    mutable std::mutex log_mu_;
    std::string log_;
    std::atomic<bool> draining_{true};
    std::thread drainer_;
};

inline json chat_body(const std::string& user, int max_tokens, bool stream = false) {
    return {{"messages", json::array({{{"role", "user"}, {"content", user}}})},
            {"max_tokens", max_tokens},
            {"temperature", 0},
            {"stream", stream}};
}

inline HttpResponse post_chat(uint16_t port, const json& body, const std::string& headers = "") {
    return http_request(port, "POST", "/v1/chat/completions", body.dump(), headers);
}

// The content pieces of an SSE answer, the finish reason and the usage chunk.
struct Streamed {
    std::string text, finish_reason;
    std::string error;  // the data of an event that is not a chunk (an error), if any
    json usage;
    bool done = false;
    int chunks = 0;
};

inline Streamed parse_sse(const std::string& body) {
    Streamed s;
    size_t at = 0;
    while ((at = body.find("data: ", at)) != std::string::npos) {
        const size_t end = body.find("\n\n", at);
        const std::string data = body.substr(at + 6, end - at - 6);
        at = end;
        if (data == "[DONE]") {
            s.done = true;
            break;
        }
        const json j = json::parse(data, nullptr, false);
        ++s.chunks;
        if (!j.is_object() || !j.contains("choices")) {  // an error event, or garbage
            s.error = data;
            continue;
        }
        if (j.contains("usage") && !j["usage"].is_null()) s.usage = j["usage"];
        for (const json& c : j["choices"]) {
            if (c["delta"].contains("content")) s.text += c["delta"]["content"].get<std::string>();
            if (!c["finish_reason"].is_null()) s.finish_reason = c["finish_reason"];
        }
    }
    return s;
}

// Opens a session named id (POST /v1/sessions); the answer's status.
inline int open_session(uint16_t port, const std::string& id, const std::string& headers = "") {
    return http_request(port, "POST", "/v1/sessions", json{{"id", id}}.dump(), headers).status;
}

// A session over two turns: opened with POST /v1/sessions, the first turn through the
// X-Session-ID header, the second (only the new message) through the body's session_id. The
// second turn's prompt holds the history, whose KV was not computed again, and it answers as
// the whole conversation sent without a session does.
inline void expect_session_continues(uint16_t port) {
    ASSERT_EQ(open_session(port, "ada"), 200);
    HttpResponse r =
        post_chat(port, chat_body("My name is Ada. Say hello to me.", 12), "X-Session-ID: ada\r\n");
    ASSERT_EQ(r.status, 200) << r.body;
    const json first = json::parse(r.body);
    EXPECT_EQ(first["session_id"], "ada");
    const std::string reply = first["choices"][0]["message"]["content"];
    const int turn1 = first["usage"]["total_tokens"];

    // Turn 2 sends only the new message (here through the body's session_id).
    json body = chat_body("What is my name?", 12);
    body["session_id"] = "ada";
    r = post_chat(port, body);
    ASSERT_EQ(r.status, 200) << r.body;
    const json second = json::parse(r.body);
    EXPECT_GT(second["usage"]["prompt_tokens"].get<int>(), turn1)
        << "the history is part of the prompt";
    EXPECT_GE(second["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), turn1 - 1)
        << "the history was not evaluated again";

    // The same as sending the whole conversation without a session.
    body = {{"messages",
             json::array({{{"role", "user"}, {"content", "My name is Ada. Say hello to me."}},
                          {{"role", "assistant"}, {"content", reply}},
                          {{"role", "user"}, {"content", "What is my name?"}}})},
            {"max_tokens", 12},
            {"temperature", 0}};
    r = post_chat(port, body);
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["choices"][0]["message"]["content"],
              second["choices"][0]["message"]["content"]);
    EXPECT_EQ(json::parse(r.body)["usage"]["prompt_tokens"], second["usage"]["prompt_tokens"]);
}

// An OpenAI client sends the whole conversation every turn: the second request finds the
// first's KV (its prompt and answer) in the prefix cache, reports it as cached, and answers as
// it did before the cache held it.
inline void expect_resent_conversation_is_cached(uint16_t port) {
    json body = chat_body("Tell me a short story about a fox who finds a lantern.", 24);
    HttpResponse r = post_chat(port, body);
    ASSERT_EQ(r.status, 200) << r.body;
    const json first = json::parse(r.body);
    const int prompt1 = first["usage"]["prompt_tokens"];
    body["messages"].push_back(
        {{"role", "assistant"}, {"content", first["choices"][0]["message"]["content"]}});
    body["messages"].push_back({{"role", "user"}, {"content", "And then what happened?"}});
    r = post_chat(port, body);
    ASSERT_EQ(r.status, 200) << r.body;
    const json second = json::parse(r.body);
    const int cached = second["usage"]["prompt_tokens_details"]["cached_tokens"];
    EXPECT_GE(cached, prompt1 / 16 * 16) << "the first prompt's whole blocks, at least";
    EXPECT_LT(cached, second["usage"]["prompt_tokens"].get<int>());
    // Sent again, now with all of its whole blocks cached: the same answer.
    r = post_chat(port, body);
    ASSERT_EQ(r.status, 200) << r.body;
    const json third = json::parse(r.body);
    EXPECT_GE(third["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), cached);
    EXPECT_EQ(third["choices"][0]["message"]["content"],
              second["choices"][0]["message"]["content"]);
}

}  // namespace deltaserve::testing
