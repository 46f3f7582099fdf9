#include "deltaserve/api/http_gateway.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <thread>
#include <vector>

#include "deltaserve/common/logging.h"
#include "gateway_core.h"
#include "http_connection.h"

namespace deltaserve::api {

namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

Status check(const GatewayOptions& o) {
    if (o.io_threads < 1 || o.max_connections < 1 || o.max_running_turns < 1 ||
        o.max_queued_turns < 0 || o.max_header_bytes < 1024 || o.max_body_bytes < 1 ||
        o.header_timeout_ms < 1 || o.body_timeout_ms < 1 || o.idle_timeout_ms < 1 ||
        o.write_timeout_ms < 1 || o.queue_timeout_ms < 1 || o.drain_timeout_ms < 0 ||
        o.stream_send_buffer_bytes < 1024) {
        return invalid_argument(
            "gateway options: threads, connections, running turns and timeouts must be >= 1, "
            "queued turns and the drain timeout >= 0, the header limit and the stream send "
            "buffer >= 1024 bytes");
    }
    return Status();
}

class Gateway final : public HttpGateway {
  public:
    Gateway(ChatEngine& engine, const GatewayOptions& o)
        : core_(engine, o), acceptor_(asio::make_strand(io_)), retry_(acceptor_.get_executor()) {}
    ~Gateway() override { stop(); }

    Status bind() {
        DS_RETURN_IF_ERROR(check(core_.options));
        const GatewayOptions& o = core_.options;
        DS_RETURN_IF_ERROR(check_bind(o.host, o.access));
        boost::system::error_code ec;
        const auto address = asio::ip::make_address(o.host, ec);
        if (ec) return invalid_argument("'" + o.host + "' is not an IP address");
        const tcp::endpoint ep(address, o.port);
        acceptor_.open(ep.protocol(), ec);
        if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
        if (!ec) acceptor_.bind(ep, ec);
        if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
        if (ec) {
            return unavailable("cannot listen on " + o.host + ":" + std::to_string(o.port) + ": " +
                               ec.message());
        }
        port_ = acceptor_.local_endpoint().port();
        accept();
        for (int i = 0; i < o.io_threads; ++i) threads_.emplace_back([this] { run(); });
        return Status();
    }

    uint16_t port() const override { return port_; }

    void stop() override {
        if (stopped_.exchange(true)) return;
        core_.stopping = true;
        asio::post(acceptor_.get_executor(), [this] {
            boost::system::error_code ec;
            acceptor_.close(ec);
            retry_.cancel();
        });
        for (auto& c : live()) c->drain();
        const auto drain = std::chrono::milliseconds(core_.options.drain_timeout_ms);
        if (!core_.runner.wait_idle_for(drain)) {
            spdlog::warn("gateway: turns still running after {} ms; ending them",
                         core_.options.drain_timeout_ms);
            core_.cut = true;
            core_.runner.wait_idle_for(std::chrono::hours(24));
        }
        // The last answers go out (each bounded by the write deadline), then the rest closes.
        const auto until = std::chrono::steady_clock::now() +
                           std::chrono::milliseconds(core_.options.write_timeout_ms);
        while (core_.metrics.connections() > 0 && std::chrono::steady_clock::now() < until) {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        for (auto& c : live()) c->close();
        work_.reset();
        io_.stop();
        for (auto& t : threads_) t.join();
    }

  private:
    std::vector<std::shared_ptr<Connection>> live() {
        std::vector<std::shared_ptr<Connection>> out;
        std::lock_guard<std::mutex> lock(core_.mu);
        for (auto& [_, w] : core_.connections) {
            if (auto c = w.lock()) out.push_back(std::move(c));
        }
        return out;
    }

    void run() {
        for (;;) {
            try {
                io_.run();
                return;
            } catch (const std::exception& e) {  // a handler threw: log it, keep serving
                spdlog::error("gateway: {}", e.what());
            }
        }
    }

    void accept() {
        acceptor_.async_accept(
            asio::make_strand(io_), [this](boost::system::error_code ec, tcp::socket socket) {
                if (core_.stopping) return;
                if (ec) {  // out of descriptors, say: try again shortly, not in a tight loop
                    spdlog::warn("gateway: accept: {}", ec.message());
                    retry_.expires_after(std::chrono::milliseconds(100));
                    retry_.async_wait([this](boost::system::error_code e) {
                        if (!e && !core_.stopping) accept();
                    });
                    return;
                }
                admit(std::move(socket));
                accept();
            });
    }

    void admit(tcp::socket socket) {
        boost::system::error_code ec;
        socket.set_option(tcp::no_delay(true), ec);
        std::shared_ptr<Connection> c;
        {
            std::lock_guard<std::mutex> lock(core_.mu);
            if (static_cast<int>(core_.connections.size()) < core_.options.max_connections) {
                c = std::make_shared<Connection>(core_, std::move(socket));
                core_.connections.emplace(c.get(), c);
            }
        }
        // Started, and released, outside the lock: a connection that ends at once (its peer
        // gone) is destroyed here, and its destructor takes the lock.
        if (c) {
            c->start();
        } else {
            core_.metrics.connection_refused();
            static const std::string over_limit =
                format_response(error_answer(503, "too many connections; try again"), false);
            socket.non_blocking(true, ec);
            socket.write_some(asio::buffer(over_limit), ec);
            socket.shutdown(tcp::socket::shutdown_both, ec);
            socket.close(ec);
        }
    }

    // Declared in the order they must be destroyed last to first.
    GatewayCore core_;
    asio::io_context io_;
    asio::executor_work_guard<asio::io_context::executor_type> work_{io_.get_executor()};
    tcp::acceptor acceptor_;
    asio::steady_timer retry_;
    std::vector<std::thread> threads_;
    uint16_t port_ = 0;
    std::atomic<bool> stopped_{false};
};

}  // namespace

Result<std::unique_ptr<HttpGateway>> HttpGateway::start(ChatEngine& engine,
                                                        const GatewayOptions& options) {
    auto g = std::make_unique<Gateway>(engine, options);
    DS_RETURN_IF_ERROR(g->bind());
    return std::unique_ptr<HttpGateway>(std::move(g));
}

}  // namespace deltaserve::api
