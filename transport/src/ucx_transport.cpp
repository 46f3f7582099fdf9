// The UCX backend's application side: connections, listeners and the transport. They wait
// on the connection's state; the progress thread (ucx_core.cpp) does the UCP calls.
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>

#include "backends.h"
#include "ucx_core.h"

namespace deltaserve::transport {
namespace {

struct SocketAddress {
    sockaddr_storage storage{};
    socklen_t length = 0;
};

// "host:port" or "[v6-host]:port"; an empty host or "*" means every interface (listen only).
Result<SocketAddress> parse_address(std::string_view address, bool passive) {
    const size_t colon = address.rfind(':');
    if (colon == std::string_view::npos || colon + 1 == address.size()) {
        return invalid_argument("address '" + std::string(address) + "' is not host:port");
    }
    std::string host(address.substr(0, colon));
    const std::string port(address.substr(colon + 1));
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
        host = host.substr(1, host.size() - 2);
    }
    char* end = nullptr;
    const long port_value = std::strtol(port.c_str(), &end, 10);
    if (*end != '\0' || port_value < 0 || port_value > 65535) {
        return invalid_argument("address '" + std::string(address) + "' has no valid port");
    }
    if (host.empty() || host == "*") {
        if (!passive) {
            return invalid_argument("address '" + std::string(address) + "' names no host");
        }
        host = "0.0.0.0";
    }
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
    addrinfo* found = nullptr;
    const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
    if (rc != 0 || found == nullptr) {
        return invalid_argument("cannot resolve '" + host + "': " + gai_strerror(rc));
    }
    SocketAddress out;
    std::memcpy(&out.storage, found->ai_addr, found->ai_addrlen);
    out.length = found->ai_addrlen;
    freeaddrinfo(found);
    return out;
}

Status closed_error(const std::string& peer) {
    return Status(StatusCode::kUnavailable, "connection to " + peer + " was closed");
}

class UcxConnection final : public Connection {
  public:
    UcxConnection(std::shared_ptr<UcxCore> core, std::shared_ptr<UcxConn> conn)
        : core_(std::move(core)), conn_(std::move(conn)) {}
    ~UcxConnection() override { close(); }

    Status send(Message message, Deadline deadline) override {
        if (message.header.size() > kMaxHeaderBytes) {
            return invalid_argument("message header of " + std::to_string(message.header.size()) +
                                    " bytes exceeds " + std::to_string(kMaxHeaderBytes));
        }
        const size_t bytes = message.header.size() + message.payload.size();
        UcxConn& c = *conn_;
        {
            std::unique_lock lock(c.mu);
            const size_t window = c.shared ? core_->options().shared_send_window_bytes
                                           : core_->options().send_window_bytes;
            const bool ready = c.changed.wait_until(lock, deadline, [&] {
                return c.closing || !c.error.ok() || c.inflight == 0 ||
                       c.inflight_bytes + bytes <= window;
            });
            if (c.closing) return closed_error(c.peer);
            if (!c.error.ok()) return c.error;
            if (!ready) {
                return Status(StatusCode::kDeadlineExceeded,
                              "send window to " + c.peer + " stayed full (" +
                                  std::to_string(c.inflight_bytes) + " bytes undelivered)");
            }
            c.inflight_bytes += bytes;
            c.inflight++;
            c.stats.messages_sent++;
            c.stats.bytes_sent += bytes;
        }
        auto boxed = std::make_shared<Message>(std::move(message));
        core_->post([core = core_.get(), conn = conn_, boxed, bytes] {
            core->send(conn, std::move(*boxed), bytes);
        });
        return {};
    }

    Buffer allocate_payload(size_t bytes) override {
        Buffer b = core_->pool().try_acquire(bytes);
        return b.data() != nullptr ? std::move(b) : Buffer::heap(bytes);
    }

    Status flush(Deadline deadline) override {
        UcxConn& c = *conn_;
        std::unique_lock lock(c.mu);
        const bool done = c.changed.wait_until(
            lock, deadline, [&] { return c.closing || !c.error.ok() || c.inflight == 0; });
        if (c.closing) return closed_error(c.peer);
        if (!c.error.ok()) return c.error;
        if (!done) {
            return Status(StatusCode::kDeadlineExceeded, "flush to " + c.peer + ": " +
                                                             std::to_string(c.inflight) +
                                                             " messages still undelivered");
        }
        return {};
    }

    Result<Message> receive(Deadline deadline) override {
        UcxConn& c = *conn_;
        std::unique_lock lock(c.mu);
        auto front_ready = [&] {
            return !c.arrivals.empty() && c.arrivals.front().state == Arrival::State::kReady;
        };
        c.changed.wait_until(lock, deadline,
                             [&] { return c.closing || front_ready() || !c.error.ok(); });
        if (c.closing) return closed_error(c.peer);
        if (front_ready()) {
            Arrival a = std::move(c.arrivals.front());
            c.arrivals.pop_front();
            const size_t bytes = a.length + a.message.header.size();
            c.held_bytes -= bytes;
            c.stats.messages_received++;
            c.stats.bytes_received += bytes;
            if (c.wants_room) {
                c.wants_room = false;
                core_->post([core = core_.get(), conn = conn_] { core->fetch_later(conn); });
            }
            return std::move(a.message);
        }
        if (!c.error.ok()) return c.error;
        return Status(StatusCode::kDeadlineExceeded, "no message from " + c.peer + " in time");
    }

    void close() override { close_now(/*force=*/false); }

    // Graceful: what was sent gets the grace period to be delivered. Force: outstanding sends
    // are canceled.
    void close_now(bool force) {
        UcxConn& c = *conn_;
        {
            std::lock_guard lock(c.mu);
            if (c.closing) return;
        }
        const auto grace = core_->options().close_grace;
        if (!force) force = !flush(Clock::now() + grace).ok();
        {
            std::lock_guard lock(c.mu);
            if (c.closing) return;
            c.closing = true;
        }
        c.changed.notify_all();
        core_->post([core = core_.get(), conn = conn_, force] { core->close(conn, force); });
        std::unique_lock lock(c.mu);
        c.changed.wait_until(lock, Clock::now() + grace + std::chrono::seconds(1),
                             [&] { return c.released; });
        c.arrivals.clear();  // returns their buffers to the pool
        c.held_bytes = 0;
    }

    std::string peer() const override {
        std::lock_guard lock(conn_->mu);
        return conn_->peer;
    }

    Status status() const override {
        std::lock_guard lock(conn_->mu);
        if (conn_->closing) return closed_error(conn_->peer);
        return conn_->error;
    }

    ConnectionStats stats() const override {
        std::lock_guard lock(conn_->mu);
        return conn_->stats;
    }

  private:
    std::shared_ptr<UcxCore> core_;
    std::shared_ptr<UcxConn> conn_;
};

class UcxListener final : public Listener {
  public:
    UcxListener(std::shared_ptr<UcxCore> core, std::shared_ptr<UcxListenerState> state)
        : core_(std::move(core)), state_(std::move(state)) {}
    ~UcxListener() override {
        (void)core_->call([core = core_.get(), state = state_] {
            core->close_listener(state);
            return Status();
        });
    }

    Result<std::unique_ptr<Connection>> accept(Deadline deadline) override {
        std::unique_lock lock(state_->mu);
        state_->arrived.wait_until(lock, deadline,
                                   [&] { return state_->closed || !state_->accepted.empty(); });
        if (!state_->accepted.empty()) {
            auto conn = std::move(state_->accepted.front());
            state_->accepted.pop_front();
            return std::unique_ptr<Connection>(new UcxConnection(core_, std::move(conn)));
        }
        if (state_->closed) return Status(StatusCode::kUnavailable, "listener closed");
        return Status(StatusCode::kDeadlineExceeded,
                      "no connection to " + state_->address + " in time");
    }

    std::string address() const override { return state_->address; }

  private:
    std::shared_ptr<UcxCore> core_;
    std::shared_ptr<UcxListenerState> state_;
};

class UcxTransport final : public Transport {
  public:
    explicit UcxTransport(std::shared_ptr<UcxCore> core) : core_(std::move(core)) {}

    std::string_view name() const override { return "ucx"; }

    Result<std::unique_ptr<Listener>> listen(std::string_view address) override {
        DS_ASSIGN_OR_RETURN(SocketAddress addr, parse_address(address, /*passive=*/true));
        auto state = std::make_shared<UcxListenerState>();
        DS_RETURN_IF_ERROR(core_->call([core = core_.get(), state, addr] {
            return core->open_listener(state, addr.storage, addr.length);
        }));
        return std::unique_ptr<Listener>(new UcxListener(core_, std::move(state)));
    }

    Result<std::unique_ptr<Connection>> connect(std::string_view address,
                                                Deadline deadline) override {
        DS_ASSIGN_OR_RETURN(SocketAddress addr, parse_address(address, /*passive=*/false));
        auto conn = std::make_shared<UcxConn>(std::string(address));
        DS_RETURN_IF_ERROR(core_->call([core = core_.get(), conn, addr] {
            return core->open_client(conn, addr.storage, addr.length);
        }));
        auto connection = std::make_unique<UcxConnection>(core_, conn);
        Status failed;
        {
            std::unique_lock lock(conn->mu);
            const bool answered = conn->changed.wait_until(
                lock, deadline, [&] { return conn->connected || !conn->error.ok(); });
            if (!conn->error.ok()) {
                failed =
                    Status(StatusCode::kUnavailable, "cannot connect to " + std::string(address) +
                                                         ": " + conn->error.message());
            } else if (!answered) {
                failed = Status(StatusCode::kDeadlineExceeded,
                                "no answer from " + std::string(address) + " in time");
            }
        }
        if (!failed.ok()) {
            connection->close_now(/*force=*/true);
            return failed;
        }
        return std::unique_ptr<Connection>(std::move(connection));
    }

    TransportStats stats() const override {
        return {core_->pool().capacity(), core_->pool().bytes_in_use()};
    }

    Result<Buffer> allocate(size_t bytes, Deadline deadline) override {
        return core_->pool().acquire(bytes, deadline);
    }

  private:
    std::shared_ptr<UcxCore> core_;
};

}  // namespace

Result<std::unique_ptr<Transport>> make_ucx_transport(const TransportOptions& options) {
    DS_ASSIGN_OR_RETURN(auto core, UcxCore::start(options));
    return std::unique_ptr<Transport>(new UcxTransport(std::move(core)));
}

}  // namespace deltaserve::transport
