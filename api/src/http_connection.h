// One client connection of the HTTP gateway: reads requests under deadlines, answers them,
// and streams a chat turn's pieces while watching for the client going away. Every member
// is touched on the connection's strand only, except those marked for the turn thread.
#pragma once

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "deltaserve/api/chat_engine.h"
#include "http_response.h"
#include "http_rules.h"

namespace deltaserve::api {

class GatewayCore;

class Connection : public std::enable_shared_from_this<Connection> {
  public:
    using Socket = boost::asio::ip::tcp::socket;
    Connection(GatewayCore& gateway, Socket socket);
    ~Connection();
    Connection(const Connection&) = delete;
    Connection& operator=(const Connection&) = delete;

    // Any thread. start: begins reading requests. drain: the gateway stops; close when idle.
    // close: close now.
    void start();
    void drain();
    void close();

  private:
    using Parser = boost::beast::http::request_parser<boost::beast::http::string_body>;
    enum class Then { kRead, kClose };

    void read_request();
    void on_header(boost::beast::error_code ec);
    void on_body(boost::beast::error_code ec);
    // A read's error: the client gone (close) or bytes that are not HTTP (400). False: none.
    bool read_failed(boost::beast::error_code ec);
    // http_routes.cpp
    void route();
    void options(const std::string& allow);  // OPTIONS: a CORS preflight, or the methods
    bool authorize();                        // false: answered (401)
    void sessions(std::string_view path);
    void list_sessions();                              // GET /v1/sessions, a page
    static constexpr int32_t kSessionListLimit = 100;  // /v1/sessions and /v1/sessions/{id}
    // http_turn.cpp
    void chat();
    void completion();  // POST /v1/completions
    // The turn of request_ (parsed): queued on the turn runner, answered as chat or text.
    void start_turn(const char* id_prefix);
    void answer(HttpAnswer a);          // a whole response, then the next request or close
    HttpAnswer body_too_large() const;  // 413
    void watch_peer();                  // a read pending during a turn: notices the client leave
    void send(std::string bytes, std::optional<Then> then = std::nullopt);
    void write_next();
    void arm(boost::asio::steady_timer& timer, int64_t ms, bool counted = true);
    void linger();  // after the last answer: discard what the client sends, briefly
    void abort();   // closes the socket; pending operations end with errors
    // result: choice 0's (or the request's error); more: the other choices of n > 1.
    void end_turn(Result<TurnResult> result, std::vector<TurnResult> more = {});
    // The answer's session fields (session_turn, session_stored) for a session turn.
    SessionAnswer session_answer(const TurnResult& r) const;
    // A queued turn not started within the queue timeout leaves the queue: 503.
    void wait_for_thread(uint64_t ticket);

    // The turn thread's side.
    bool on_piece(std::string_view piece);
    bool on_tool_call(int index, const model::ToolCall& call);
    // Keeps a token's log-probabilities for the next streamed chunk.
    void on_logprobs(const LogprobEntry& entry) { pending_logprobs_.push_back(entry); }
    // The log-probabilities a chunk carries (those since the last; taken), or null.
    std::optional<std::vector<LogprobEntry>> take_logprobs();
    // Streams one chunk (the SSE head first); false when the client is gone or too slow.
    bool stream_chunk(const std::function<std::string(bool first)>& chunk);

    GatewayCore& g_;
    Socket socket_;
    uint16_t local_port_ = 0;  // the port the client connected to (the Host check)
    boost::asio::steady_timer read_timer_, write_timer_, queue_timer_;
    boost::beast::flat_buffer buffer_;
    std::optional<Parser> parser_;
    std::deque<std::string> outbox_;
    std::optional<Then> then_;  // once the outbox is written
    bool writing_ = false, reading_ = false, in_turn_ = false, draining_ = false;
    bool keep_alive_ = true, first_request_ = true, closed_ = false, lingering_ = false;
    bool resume_ = false;  // watch_peer's read was cancelled to read the next request
    static constexpr int64_t kLingerMs = 2000;

    // The request being answered (set before its turn starts, read-only during it).
    std::string path_;                 // its target's path
    bool head_ = false;                // HEAD: answered as GET, without the body
    boost::beast::http::verb verb_{};  // its method, HEAD as GET
    std::string allow_origin_;         // Access-Control-Allow-Origin for its answers, or ""
    std::string tenant_;               // whose key it carries
    ChatRequest request_;
    std::string id_;
    int64_t created_ = 0;
    std::vector<LogprobEntry> pending_logprobs_;  // the turn thread's, then end_turn's
    bool completion_ = false;  // a text completion (text_completion answers), not a chat
    bool echo_ = false;        // ... whose text starts with its prompt
    int32_t echoed_top_ = -1,
            listed_top_ = -1;  // ... its prompt's scores shown (CompletionRequest)
    size_t text_offset_ = 0;   // characters streamed so far (the logprobs' text_offset)
    std::chrono::steady_clock::time_point started_;
    bool stream_keep_alive_ = false;  // a stream's head says keep-alive: more may follow it

    // Shared with the turn thread.
    std::atomic<bool> alive_{true};
    std::atomic<size_t> unread_{0};  // bytes queued for the client, not yet written
    bool head_sent_ = false;         // turn thread until the turn ends
};

}  // namespace deltaserve::api
