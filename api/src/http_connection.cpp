#include "http_connection.h"

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/http/read.hpp>
#include <nlohmann/json.hpp>
#include <random>

#include "deltaserve/common/logging.h"
#include "gateway_core.h"
#include "random_id.h"

namespace deltaserve::api {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

namespace {

int64_t unix_seconds() {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

std::string sse_event(const std::string& data) { return format_chunk("data: " + data + "\n\n"); }

nlohmann::json session_json(const SessionInfo& s) {
    return {{"id", s.id},
            {"object", "session"},
            {"turns", s.turns},
            {"messages", s.messages},
            {"tokens", s.tokens},
            {"cached_tokens", s.cached_tokens},
            {"idle_seconds", s.idle_seconds},
            {"running", s.running}};
}

// A turn's or a session call's error; a session that is not there is "session_not_found".
HttpAnswer session_error(const Status& st, bool about_session) {
    return status_answer(
        st, about_session && st.code() == StatusCode::kNotFound ? "session_not_found" : "");
}

}  // namespace

Connection::Connection(GatewayCore& gateway, Socket socket)
    : g_(gateway),
      socket_(std::move(socket)),
      read_timer_(socket_.get_executor()),
      write_timer_(socket_.get_executor()),
      queue_timer_(socket_.get_executor()) {
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
    if (ec == http::error::header_limit) {
        keep_alive_ = false;
        return answer(error_answer(431, "the request line and headers are larger than " +
                                            std::to_string(g_.options.max_header_bytes) +
                                            " bytes"));
    }
    if (read_failed(ec)) return;
    const auto& req = parser_->get();
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
    if (ec == http::error::body_limit) {
        keep_alive_ = false;
        return answer(error_answer(413, "the request body is larger than " +
                                            std::to_string(g_.options.max_body_bytes) + " bytes"));
    }
    if (read_failed(ec)) return;
    keep_alive_ = keep_alive_ && parser_->get().keep_alive();
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

// ---- routing ---------------------------------------------------------------------------

void Connection::route() {
    const auto& req = parser_->get();
    const std::string_view target(req.target().data(), req.target().size());
    const std::string_view path = target.substr(0, target.find('?'));
    auto only = [&](http::verb verb, const char* name) {
        if (req.method() == verb) return true;
        answer(error_answer(405, std::string("use ") + name));
        return false;
    };
    if (path == "/health") {
        if (!only(http::verb::get, "GET")) return;
        if (g_.stopping) return answer(error_answer(503, "the server is shutting down"));
        return answer({200, R"({"status":"ok"})"});
    }
    // Everything else needs a key when the server has keys (/metrics only when asked to).
    const bool keyed =
        path.substr(0, 4) == "/v1/" || (path == "/metrics" && g_.access.options().metrics_need_key);
    if (keyed) {
        const auto h = req.find(http::field::authorization);
        const std::string_view authorization =
            h == req.end() ? std::string_view()
                           : std::string_view(h->value().data(), h->value().size());
        auto tenant = g_.access.tenant_of_header(authorization);
        if (!tenant.ok() && path == "/metrics" && authorization.size() > 7 &&
            g_.access.admin(authorization.substr(7))) {
            tenant = std::string();
        }
        if (!tenant.ok()) {
            g_.metrics.request_failed();
            return answer(status_answer(tenant.status()));
        }
        tenant_ = std::move(*tenant);
    }
    if (path == "/v1/models") {
        if (!only(http::verb::get, "GET")) return;
        const nlohmann::json j = {{"object", "list"},
                                  {"data", nlohmann::json::array({{{"id", g_.engine.model_id()},
                                                                   {"object", "model"},
                                                                   {"created", 0},
                                                                   {"owned_by", "deltaserve"}}})}};
        return answer({200, j.dump()});
    }
    if (path == "/metrics") {
        if (!only(http::verb::get, "GET")) return;
        return answer({200, g_.metrics.render(g_.engine.stats()), "text/plain; version=0.0.4"});
    }
    if (path == "/v1/chat/completions") {
        if (!only(http::verb::post, "POST")) return;
        return chat();
    }
    if (path == "/v1/sessions" || path.substr(0, 13) == "/v1/sessions/") return sessions(path);
    answer(error_answer(404, "no route " + std::string(path.substr(0, 256))));
}

void Connection::chat() {
    const auto& req = parser_->get();
    started_ = std::chrono::steady_clock::now();
    auto parsed = parse_chat_request(req.body(), g_.options.sampling);
    if (!parsed.ok()) {
        g_.metrics.request_failed();
        return answer(status_answer(parsed.error()));
    }
    request_ = std::move(*parsed);
    const std::string& model = g_.engine.model_id();
    if (!request_.model.empty() && request_.model != model) {
        g_.metrics.request_failed();
        return answer(error_answer(
            404,
            "the model '" + request_.model + "' does not exist (this server has '" + model + "')",
            "model_not_found"));
    }
    if (request_.session_id.empty() && req.find("X-Session-ID") != req.end()) {
        request_.session_id = std::string(req["X-Session-ID"]);
        if (Status st = check_session_id(request_.session_id, "X-Session-ID"); !st.ok()) {
            g_.metrics.request_failed();
            return answer(status_answer(st));
        }
    }
    request_.tenant = tenant_;  // a session not open (or another key's) ends the turn: 404
    if (request_.max_tokens < 0) request_.max_tokens = g_.options.default_max_tokens;
    if (!request_.seed_given) request_.sampling.seed = std::random_device{}();
    id_ = random_id("chatcmpl-", 12);
    created_ = unix_seconds();
    head_sent_ = false;
    stream_keep_alive_ = keep_alive_ && !draining_ && !g_.stopping;
    in_turn_ = true;
    if (request_.stream) {
        // Small, so that a client that stops reading fills outbox_ (write deadline,
        // max_unread_bytes) instead of megabytes of kernel buffer.
        beast::error_code ec;
        socket_.set_option(asio::socket_base::send_buffer_size(g_.options.stream_send_buffer_bytes),
                           ec);
    }
    auto self = shared_from_this();
    const uint64_t ticket = g_.runner.try_submit([self] {
        asio::post(self->socket_.get_executor(), [self] { self->queue_timer_.cancel(); });
        TurnCallbacks callbacks;
        callbacks.on_piece = [&](std::string_view piece) { return self->on_piece(piece); };
        callbacks.wanted = [&] { return self->alive_ && !self->g_.cut; };
        Result<TurnResult> r = self->g_.engine.run_turn(self->request_, callbacks);
        asio::post(self->socket_.get_executor(),
                   [self, r = std::move(r)]() mutable { self->end_turn(std::move(r)); });
    });
    if (ticket == 0) {
        in_turn_ = false;
        g_.metrics.request_failed();
        return answer(error_answer(503, "the server is busy: every turn thread is taken and " +
                                            std::to_string(g_.options.max_queued_turns) +
                                            " requests wait; try again"));
    }
    wait_for_thread(ticket);
    watch_peer();
}

void Connection::wait_for_thread(uint64_t ticket) {
    queue_timer_.expires_after(std::chrono::milliseconds(g_.options.queue_timeout_ms));
    queue_timer_.async_wait([self = shared_from_this(), ticket](beast::error_code ec) {
        if (ec || self->closed_ || !self->g_.runner.cancel(ticket)) return;  // it started
        self->in_turn_ = false;
        self->g_.metrics.request_failed();
        self->answer(error_answer(503, "the server is busy: no turn thread was free within " +
                                           std::to_string(self->g_.options.queue_timeout_ms) +
                                           " ms; try again"));
    });
}

void Connection::sessions(std::string_view path) {
    const auto& req = parser_->get();
    if (path == "/v1/sessions") {
        if (req.method() == http::verb::get) {  // this key's sessions
            nlohmann::json list = nlohmann::json::array();
            for (const SessionInfo& s : g_.engine.sessions()) {
                if (s.tenant == tenant_) list.push_back(session_json(s));
            }
            return answer({200, nlohmann::json{{"object", "list"}, {"data", list}}.dump()});
        }
        if (req.method() != http::verb::post) return answer(error_answer(405, "use GET or POST"));
        std::string id;
        if (!req.body().empty()) {  // {"id": NAME}, optional
            const auto j = nlohmann::json::parse(req.body(), nullptr, false);
            if (j.is_discarded() || !j.is_object())
                return answer(error_answer(400, "the body must be a JSON object (or empty)"));
            if (auto it = j.find("id"); it != j.end() && !it->is_null()) {
                if (!it->is_string()) return answer(error_answer(400, "'id' must be a string"));
                id = it->get<std::string>();
                if (Status st = check_session_id(id, "id"); !st.ok())
                    return answer(status_answer(st));
            }
        }
        auto info = g_.engine.open_session(tenant_, id);
        if (!info.ok()) return answer(status_answer(info.status()));
        HttpAnswer a{200, session_json(*info).dump()};
        a.session_id = info->id;
        return answer(a);
    }
    const std::string id(path.substr(13));
    if (Status st = check_session_id(id, "the session id in the path"); !st.ok()) {
        return answer(status_answer(st));
    }
    if (req.method() == http::verb::get) {
        auto info = g_.engine.session_info(tenant_, id);
        if (!info.ok()) return answer(session_error(info.status(), true));
        return answer({200, session_json(*info).dump()});
    }
    if (req.method() == http::verb::delete_) {
        if (Status st = g_.engine.close_session(tenant_, id); !st.ok())
            return answer(session_error(st, true));
        return answer(
            {200,
             nlohmann::json{{"id", id}, {"object", "session.deleted"}, {"deleted", true}}.dump()});
    }
    answer(error_answer(405, "use GET or DELETE"));
}

// ---- a turn ----------------------------------------------------------------------------

bool Connection::on_piece(std::string_view piece) {
    if (!alive_ || g_.cut) return false;
    if (!request_.stream) return true;
    if (unread_.load() > g_.options.max_unread_bytes) {
        spdlog::warn("gateway: a client left {} streamed bytes unread; dropping it",
                     unread_.load());
        close();
        return false;
    }
    std::string bytes;
    if (!head_sent_) bytes = format_sse_head(request_.session_id, stream_keep_alive_);
    bytes += sse_event(chunk_json(id_, created_, g_.engine.model_id(), std::string(piece),
                                  !head_sent_, "", std::nullopt));
    head_sent_ = true;
    asio::post(socket_.get_executor(), [self = shared_from_this(), b = std::move(bytes)]() mutable {
        self->send(std::move(b));
    });
    return true;
}

void Connection::end_turn(Result<TurnResult> r) {
    in_turn_ = false;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
    if (!r.ok() || !alive_) {
        g_.metrics.request_failed();
    } else {
        g_.metrics.request_done(*r, seconds);
        if (g_.cut && r->finish_reason == "cancelled") r->finish_reason = "shutdown";
    }
    if (closed_ || !alive_) return abort();
    const std::string& model = g_.engine.model_id();
    if (!request_.stream || (!head_sent_ && !r.ok())) {
        if (!r.ok()) return answer(session_error(r.error(), !request_.session_id.empty()));
        HttpAnswer a{200, completion_json(id_, created_, model, r->text, r->finish_reason, r->usage,
                                          request_.session_id)};
        a.session_id = request_.session_id;
        a.kv_source = r->usage.kv_source;
        return answer(a);
    }
    std::string tail = head_sent_ ? "" : format_sse_head(request_.session_id, stream_keep_alive_);
    if (!r.ok()) {
        const HttpAnswer e = status_answer(r.error());
        tail += sse_event(error_json(r.error().message(), "server_error", e.status));
    } else {
        tail += sse_event(chunk_json(id_, created_, model,
                                     head_sent_ ? std::nullopt : std::optional<std::string>(""),
                                     !head_sent_, r->finish_reason, std::nullopt));
        if (request_.include_usage) {
            tail += sse_event(chunk_json(id_, created_, model, std::nullopt, false, "", r->usage));
        }
    }
    tail += sse_event("[DONE]");
    tail += format_chunk("");
    const bool keep = stream_keep_alive_ && !draining_ && !g_.stopping;
    send(std::move(tail), keep ? Then::kRead : Then::kClose);
}

// ---- writing ---------------------------------------------------------------------------

void Connection::answer(const HttpAnswer& a) {
    const bool keep = keep_alive_ && !draining_ && !g_.stopping;
    send(format_response(a, keep), keep ? Then::kRead : Then::kClose);
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
