#include "http_connection.h"

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/http/read.hpp>

#include "deltaserve/common/logging.h"
#include "gateway_core.h"

namespace deltaserve::api {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

Connection::Connection(GatewayCore& gateway, Socket socket)
    : g_(gateway),
      socket_(std::move(socket)),
      read_timer_(socket_.get_executor()),
      write_timer_(socket_.get_executor()),
      queue_timer_(socket_.get_executor()) {
    beast::error_code ec;
    local_port_ = socket_.local_endpoint(ec).port();
    g_.metrics.connection_opened();
}

Connection::~Connection() {
    g_.metrics.connection_closed();
    std::lock_guard<std::mutex> lock(g_.mu);
    g_.connections.erase(this);
}

void Connection::start() {
    asio::dispatch(socket_.get_executor(), [self = shared_from_this()] { self->read_request(); });
}

void Connection::drain() {
    asio::post(socket_.get_executor(), [self = shared_from_this()] {
        self->draining_ = true;
        self->keep_alive_ = false;
        if (!self->in_turn_ && !self->writing_) self->abort();
    });
}

void Connection::close() {
    asio::post(socket_.get_executor(), [self = shared_from_this()] { self->abort(); });
}

void Connection::abort() {
    alive_ = false;
    if (closed_) return;
    closed_ = true;
    beast::error_code ec;
    read_timer_.cancel();
    write_timer_.cancel();
    queue_timer_.cancel();
    socket_.shutdown(Socket::shutdown_both, ec);
    socket_.close(ec);
}

void Connection::arm(asio::steady_timer& timer, int64_t ms, bool counted) {
    timer.expires_after(std::chrono::milliseconds(ms));
    timer.async_wait([self = shared_from_this(), counted](beast::error_code ec) {
        if (ec) return;  // cancelled: the operation finished in time
        if (counted) self->g_.metrics.deadline_missed();
        self->abort();
    });
}

void Connection::linger() {
    if (closed_) return;
    lingering_ = true;
    arm(read_timer_, kLingerMs, /*counted=*/false);
    if (reading_) return;  // watch_peer's read comes back here
    reading_ = true;
    socket_.async_read_some(buffer_.prepare(4096),
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                                self->reading_ = false;
                                if (ec) return self->abort();
                                self->buffer_.consume(self->buffer_.size());
                                self->linger();
                            });
}

// ---- reading --------------------------------------------------------------------------

void Connection::read_request() {
    if (closed_) return;
    if (draining_ || g_.stopping) return abort();
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(g_.options.max_header_bytes));
    parser_->body_limit(g_.options.max_body_bytes);
    arm(read_timer_, first_request_ ? g_.options.header_timeout_ms : g_.options.idle_timeout_ms);
    first_request_ = false;
    reading_ = true;
    http::async_read_header(socket_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                                self->reading_ = false;
                                self->on_header(ec);
                            });
}

bool Connection::read_failed(beast::error_code ec) {
    if (!ec) return false;
    if (ec == http::error::end_of_stream || ec == asio::error::eof ||
        ec == asio::error::operation_aborted || ec == asio::error::connection_reset) {
        abort();  // gone, or cut at a deadline
    } else {
        keep_alive_ = false;
        answer(error_answer(400, "malformed HTTP request: " + ec.message()));
    }
    return true;
}

void Connection::on_header(beast::error_code ec) {
    if (closed_) return;
    head_ = false;
    allow_origin_.clear();
    if (ec == http::error::header_limit) {
        keep_alive_ = false;
        return answer(error_answer(431, "the request line and headers are larger than " +
                                            std::to_string(g_.options.max_header_bytes) +
                                            " bytes"));
    }
    if (ec == http::error::body_limit) {  // a Content-Length over the limit, seen in the head
        keep_alive_ = false;
        return answer(body_too_large());
    }
    if (read_failed(ec)) return;
    const auto& req = parser_->get();
    keep_alive_ = keep_alive_ && req.keep_alive();
    head_ = req.method() == http::verb::head;
    const auto target = parse_target(std::string_view(req.target().data(), req.target().size()));
    if (!target.ok()) {
        keep_alive_ = false;
        return answer(status_answer(target.status()));
    }
    path_ = target->path;
    const bool has_body = parser_->chunked() || parser_->content_length().value_or(0) > 0;
    if (auto refusal = g_.rules.check(req, *target, local_port_, has_body)) {
        if (has_body) keep_alive_ = false;  // its body is not read
        g_.metrics.request_failed();
        return answer(*refusal);
    }
    allow_origin_ = g_.rules.allowed_origin(req);
    if (req.find(http::field::expect) != req.end() &&
        beast::iequals(req[http::field::expect], "100-continue")) {
        send("HTTP/1.1 100 Continue\r\n\r\n");
    }
    arm(read_timer_, g_.options.body_timeout_ms);
    reading_ = true;
    http::async_read(socket_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                         self->reading_ = false;
                         self->on_body(ec);
                     });
}

void Connection::on_body(beast::error_code ec) {
    if (closed_) return;
    read_timer_.cancel();
    if (ec == http::error::body_limit) {  // a chunked body over the limit
        keep_alive_ = false;
        return answer(body_too_large());
    }
    if (read_failed(ec)) return;
    try {  // nothing below throws by design; an exception must still not end the process
        route();
    } catch (const std::exception& e) {
        spdlog::error("gateway: request failed: {}", e.what());
        keep_alive_ = false;
        if (!in_turn_) answer(error_answer(500, "internal error"));
    }
}

void Connection::watch_peer() {
    if (closed_ || reading_ || buffer_.size() > g_.options.max_header_bytes) return;
    reading_ = true;
    socket_.async_read_some(
        buffer_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
            self->reading_ = false;
            if (self->resume_) {  // the turn is answered: on to the next request
                self->resume_ = false;
                if (!ec) self->buffer_.commit(n);
                return self->read_request();
            }
            if (self->lingering_) {
                if (ec) return self->abort();
                self->buffer_.consume(self->buffer_.size());
                return self->linger();
            }
            if (ec) {  // gone: the turn stops (TurnCallbacks::wanted)
                self->alive_ = false;
                if (!self->in_turn_ && !self->writing_) self->abort();
                return;
            }
            self->buffer_.commit(n);  // a pipelined request: read once the turn is answered
            if (self->in_turn_ || self->writing_) return self->watch_peer();
            self->read_request();
        });
}

// ---- writing ---------------------------------------------------------------------------

void Connection::answer(HttpAnswer a) {
    const bool keep = keep_alive_ && !draining_ && !g_.stopping;
    if (a.allow_origin.empty()) a.allow_origin = allow_origin_;
    send(format_response(a, keep, head_), keep ? Then::kRead : Then::kClose);
}

HttpAnswer Connection::body_too_large() const {
    return error_answer(413, "the request body is larger than " +
                                 std::to_string(g_.options.max_body_bytes) + " bytes");
}

void Connection::send(std::string bytes, std::optional<Then> then) {
    if (closed_) return;
    if (then) then_ = then;
    unread_ += bytes.size();
    outbox_.push_back(std::move(bytes));
    if (!writing_) write_next();
}

void Connection::write_next() {
    if (closed_) return;
    if (outbox_.empty()) {
        writing_ = false;
        if (!then_) return;  // more is coming (a turn streams)
        const Then then = *then_;
        then_.reset();
        if (then == Then::kClose || draining_ || !alive_) {
            // Half-close, then read what the client still sends for a moment: closing with
            // unread bytes would reset the connection before it read the answer.
            beast::error_code ec;
            socket_.shutdown(Socket::shutdown_send, ec);
            return linger();
        }
        if (reading_) {
            // watch_peer's read is pending, and the next request may be in buffer_ already
            // (pipelined behind the turn): stop that read; its handler reads the request.
            resume_ = true;
            beast::error_code ec;
            socket_.cancel(ec);
            return;
        }
        read_request();
        return;
    }
    writing_ = true;
    arm(write_timer_, g_.options.write_timeout_ms);
    asio::async_write(socket_, asio::buffer(outbox_.front()),
                      [self = shared_from_this()](beast::error_code ec, size_t) {
                          self->write_timer_.cancel();
                          self->unread_ -= self->outbox_.front().size();
                          self->outbox_.pop_front();
                          if (ec) return self->abort();
                          self->write_next();
                      });
}

}  // namespace deltaserve::api
