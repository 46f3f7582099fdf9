// The HTTP/1.1 under EtcdClient: one POST to one etcd endpoint under a deadline, and the
// streamed answer of a watch read one JSON message at a time. Each runs on its own
// io_context, so any thread may call; a stream is cancelled from another thread.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "deltaserve/common/status.h"

namespace deltaserve::api::etcd {

// The largest answer taken whole, and the longest message of a stream.
inline constexpr size_t kMaxAnswerBytes = size_t{64} << 20;

struct Endpoint {
    std::string host;
    std::string port;
};
// "host:port" or "http://host:port"; https and anything else is refused by name.
Result<Endpoint> parse_endpoint(std::string_view text);

struct Answer {
    unsigned status = 0;
    std::string body;
};

// POSTs `body` (JSON) to `path` with `token` as its Authorization (none when empty). A
// connection or a deadline that fails is kUnavailable / kDeadlineExceeded; any HTTP answer is
// returned as it is.
Result<Answer> post(const Endpoint& endpoint, std::string_view path, const std::string& body,
                    const std::string& token, std::chrono::milliseconds timeout);

// A POST whose answer is a stream of newline-separated JSON messages (a watch).
class Stream {
  public:
    Stream();
    ~Stream();
    // Connects and sends the request; reads the answer's head. A status other than 200 is an
    // error from etcd's body (error_of).
    Status open(const Endpoint& endpoint, std::string_view path, const std::string& body,
                const std::string& token, std::chrono::milliseconds timeout);
    // The next message: nullopt at the end of the stream; kDeadlineExceeded when no byte came
    // for `idle`; kAborted once cancel() was called.
    Result<std::optional<std::string>> next(std::chrono::milliseconds idle);
    // Any thread: ends a next() that waits, and every later one.
    void cancel();

  private:
    // Runs the io_context until the operation under way finishes (the stream's deadline
    // bounds it); false when cancelled first.
    bool run();
    void finish(const boost::beast::error_code& ec);

    boost::asio::io_context ioc_;
    boost::beast::tcp_stream stream_;
    boost::beast::flat_buffer buffer_;
    boost::beast::http::request<boost::beast::http::string_body> request_;
    std::optional<boost::beast::http::response_parser<boost::beast::http::string_body>> parser_;
    // The parser keeps a reference to its chunk callback: it lives here.
    std::function<size_t(uint64_t, boost::beast::string_view, boost::beast::error_code&)> on_chunk_;
    Endpoint endpoint_;
    std::string pending_;  // bytes of the body not yet split into messages
    bool ended_ = false;
    // Set by the handlers (members: a handler may run in the destructor).
    bool done_ = false;
    boost::beast::error_code ec_;
    const char* doing_ = "";
    std::atomic<bool> cancelled_{false};
};

}  // namespace deltaserve::api::etcd
