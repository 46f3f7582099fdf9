#include "deltaserve/api/http_gateway.h"

#include <utility>  // before asio: Boost 1.74 under C++20 needs it

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <list>
#include <mutex>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "deltaserve/common/logging.h"
#include "metrics.h"

namespace deltaserve::api {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Request = http::request<http::string_body>;

int64_t unix_seconds() {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

std::string random_id(const char* prefix) {
    static std::mutex mu;
    static std::mt19937_64 rng{std::random_device{}()};
    std::lock_guard<std::mutex> lock(mu);
    char buf[40];
    std::snprintf(buf, sizeof buf, "%s%016llx", prefix, static_cast<unsigned long long>(rng()));
    return buf;
}

class Gateway;

// One client connection: reads requests until the client closes or the gateway stops.
class Connection {
  public:
    Connection(Gateway& g, tcp::socket socket) : g_(g), socket_(std::move(socket)) {}
    void serve();
    void close() {
        beast::error_code ec;
        socket_.shutdown(tcp::socket::shutdown_both, ec);
    }

  private:
    bool handle(const Request& req);  // false: close the connection
    bool reply(const Request& req, http::status status, const std::string& body,
               const char* type = "application/json");
    bool error(const Request& req, http::status status, const std::string& message);
    bool chat(const Request& req);

    Gateway& g_;
    tcp::socket socket_;
};

class Gateway : public HttpGateway {
  public:
    Gateway(ChatEngine& engine, const GatewayOptions& o) : engine_(engine), o_(o), acceptor_(io_) {}
    ~Gateway() override { stop(); }

    Status bind() {
        beast::error_code ec;
        const auto address = asio::ip::make_address(o_.host, ec);
        if (ec) return invalid_argument("'" + o_.host + "' is not an IP address");
        const tcp::endpoint ep(address, o_.port);
        acceptor_.open(ep.protocol(), ec);
        if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
        if (!ec) acceptor_.bind(ep, ec);
        if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
        if (ec) {
            return Status(StatusCode::kUnavailable, "cannot listen on " + o_.host + ":" +
                                                        std::to_string(o_.port) + ": " +
                                                        ec.message());
        }
        port_ = acceptor_.local_endpoint().port();
        accept_thread_ = std::thread([this] { accept_loop(); });
        return Status();
    }

    uint16_t port() const override { return port_; }

    void stop() override {
        if (stopping_.exchange(true) || !accept_thread_.joinable()) return;
        {  // A blocking accept does not notice close(): wake it with a connection of our own.
            beast::error_code ec;
            tcp::socket poke(io_);
            auto to = acceptor_.local_endpoint(ec);
            if (to.address().is_unspecified())
                to.address(
                    asio::ip::make_address(to.protocol() == tcp::v6() ? "::1" : "127.0.0.1"));
            poke.connect(to, ec);
        }
        accept_thread_.join();
        beast::error_code ec;
        acceptor_.close(ec);
        std::unique_lock<std::mutex> lock(mu_);
        for (Connection* c : open_) c->close();
        idle_.wait(lock, [&] { return active_ == 0; });
    }

    ChatEngine& engine() { return engine_; }
    const GatewayOptions& options() const { return o_; }
    Metrics& metrics() { return metrics_; }
    bool stopping() const { return stopping_; }

  private:
    void accept_loop() {
        while (!stopping_) {
            beast::error_code ec;
            tcp::socket socket(io_);
            acceptor_.accept(socket, ec);
            if (ec) {
                if (stopping_) break;
                spdlog::warn("accept: {}", ec.message());
                std::this_thread::sleep_for(std::chrono::milliseconds(10));
                continue;
            }
            if (stopping_) break;
            std::lock_guard<std::mutex> lock(mu_);
            ++active_;
            std::thread([this, s = std::move(socket)]() mutable {
                Connection c(*this, std::move(s));
                {
                    std::lock_guard<std::mutex> l(mu_);
                    open_.push_back(&c);
                }
                c.serve();
                std::lock_guard<std::mutex> l(mu_);
                open_.remove(&c);
                if (--active_ == 0) idle_.notify_all();
            }).detach();
        }
    }

    ChatEngine& engine_;
    GatewayOptions o_;
    asio::io_context io_;
    tcp::acceptor acceptor_;
    uint16_t port_ = 0;
    std::atomic<bool> stopping_{false};
    std::thread accept_thread_;
    std::mutex mu_;
    std::condition_variable idle_;  // active_ reached 0
    int active_ = 0;                // connection threads running
    std::list<Connection*> open_;
    Metrics metrics_;
};

void Connection::serve() {
    beast::flat_buffer buffer;
    for (;;) {
        http::request_parser<http::string_body> parser;
        parser.body_limit(g_.options().max_body_bytes);
        beast::error_code ec;
        http::read(socket_, buffer, parser, ec);
        if (ec == http::error::end_of_stream || ec == asio::error::eof ||
            ec == asio::error::connection_reset || ec == asio::error::operation_aborted ||
            ec == asio::error::bad_descriptor || g_.stopping()) {
            break;
        }
        if (ec == http::error::body_limit) {
            Request r;
            error(r, http::status::payload_too_large,
                  "the request body is larger than " + std::to_string(g_.options().max_body_bytes) +
                      " bytes");
            break;
        }
        if (ec) {
            Request r;
            error(r, http::status::bad_request, "malformed HTTP request: " + ec.message());
            break;
        }
        const Request& req = parser.get();
        if (!handle(req) || !req.keep_alive()) break;
    }
    beast::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_send, ec);
}

bool Connection::reply(const Request& req, http::status status, const std::string& body,
                       const char* type) {
    http::response<http::string_body> res{status, req.version() ? req.version() : 11};
    res.set(http::field::server, "deltaserve");
    res.set(http::field::content_type, type);
    res.keep_alive(req.keep_alive());
    res.body() = body;
    res.prepare_payload();
    beast::error_code ec;
    http::write(socket_, res, ec);
    return !ec;
}

bool Connection::error(const Request& req, http::status status, const std::string& message) {
    const int code = static_cast<int>(status);
    const char* type = code == 404   ? "not_found_error"
                       : code >= 500 ? "server_error"
                                     : "invalid_request_error";
    return reply(req, status, error_json(message, type, code));
}

bool Connection::handle(const Request& req) {
    const std::string target(req.target());
    const std::string path = target.substr(0, target.find('?'));
    if (path == "/health") {
        if (req.method() != http::verb::get)
            return error(req, http::status::method_not_allowed, "use GET");
        return reply(req, http::status::ok, R"({"status":"ok"})");
    }
    if (path == "/v1/models") {
        if (req.method() != http::verb::get)
            return error(req, http::status::method_not_allowed, "use GET");
        const nlohmann::json j = {{"object", "list"},
                                  {"data", nlohmann::json::array({{{"id", g_.engine().model_id()},
                                                                   {"object", "model"},
                                                                   {"created", 0},
                                                                   {"owned_by", "deltaserve"}}})}};
        return reply(req, http::status::ok, j.dump());
    }
    if (path == "/metrics") {
        if (req.method() != http::verb::get)
            return error(req, http::status::method_not_allowed, "use GET");
        return reply(req, http::status::ok, g_.metrics().render(g_.engine().stats()),
                     "text/plain; version=0.0.4");
    }
    if (path == "/v1/chat/completions") {
        if (req.method() != http::verb::post)
            return error(req, http::status::method_not_allowed, "use POST");
        return chat(req);
    }
    return error(req, http::status::not_found, "no route " + path);
}

bool Connection::chat(const Request& req) {
    const auto t0 = std::chrono::steady_clock::now();
    auto parsed = parse_chat_request(req.body(), g_.options().sampling);
    if (!parsed.ok()) {
        g_.metrics().request_failed();
        return error(req, http::status::bad_request, parsed.error().message());
    }
    ChatRequest& r = *parsed;
    if (!r.model.empty() && r.model != g_.engine().model_id()) {
        g_.metrics().request_failed();
        return error(req, http::status::not_found,
                     "the model '" + r.model + "' does not exist (this server has '" +
                         g_.engine().model_id() + "')");
    }
    if (r.session_id.empty()) r.session_id = std::string(req["X-Session-ID"]);
    if (r.max_tokens < 0) r.max_tokens = g_.options().default_max_tokens;
    if (!r.seed_given) r.sampling.seed = std::random_device{}();
    const std::string id = random_id("chatcmpl-");
    const int64_t created = unix_seconds();
    const std::string model = g_.engine().model_id();

    if (!r.stream) {
        auto turn = g_.engine().run_turn(r, [](std::string_view) { return true; });
        if (!turn.ok()) {
            g_.metrics().request_failed();
            const StatusCode c = turn.error().code();
            const bool client = c == StatusCode::kOutOfRange || c == StatusCode::kInvalidArgument;
            return error(req,
                         client ? http::status::bad_request
                         : c == StatusCode::kFailedPrecondition ? http::status::conflict
                                                                : http::status::internal_server_error,
                         turn.error().message());
        }
        g_.metrics().request_done(
            *turn, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        return reply(req, http::status::ok,
                     completion_json(id, created, model, turn->text, turn->finish_reason,
                                     turn->usage, r.session_id));
    }

    // Server-sent events: headers now, a chunk per piece, then [DONE].
    http::response<http::empty_body> res{http::status::ok, req.version()};
    res.set(http::field::server, "deltaserve");
    res.set(http::field::content_type, "text/event-stream");
    res.set(http::field::cache_control, "no-cache");
    if (!r.session_id.empty()) res.set("X-Session-ID", r.session_id);
    res.keep_alive(false);
    res.chunked(true);
    http::response_serializer<http::empty_body> sr{res};
    beast::error_code ec;
    http::write_header(socket_, sr, ec);
    if (ec) return false;
    bool first = true, alive = true;
    auto send = [&](const std::string& data) {
        const std::string event = "data: " + data + "\n\n";
        asio::write(socket_, http::make_chunk(asio::buffer(event)), ec);
        alive = !ec;
        return alive;
    };
    auto turn = g_.engine().run_turn(r, [&](std::string_view piece) {
        const bool ok =
            send(chunk_json(id, created, model, std::string(piece), first, "", std::nullopt));
        first = false;
        return ok;
    });
    if (!alive) {
        g_.metrics().request_failed();
        return false;  // the client went away; the turn was cancelled
    }
    if (!turn.ok()) {
        g_.metrics().request_failed();
        send(error_json(turn.error().message(), "server_error", 500));
    } else {
        g_.metrics().request_done(
            *turn, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        send(chunk_json(id, created, model, first ? std::optional<std::string>("") : std::nullopt,
                        first, turn->finish_reason, std::nullopt));
        if (r.include_usage)
            send(chunk_json(id, created, model, std::nullopt, false, "", turn->usage));
    }
    send("[DONE]");
    asio::write(socket_, http::make_chunk_last(), ec);
    return false;
}

}  // namespace

Result<std::unique_ptr<HttpGateway>> HttpGateway::start(ChatEngine& engine,
                                                        const GatewayOptions& options) {
    auto g = std::make_unique<Gateway>(engine, options);
    DS_RETURN_IF_ERROR(g->bind());
    return std::unique_ptr<HttpGateway>(std::move(g));
}

}  // namespace deltaserve::api
