// The in-process transport: the embedded mode's data plane. A connection is two queues of
// messages that move (never copy) their payloads; the same windows, deadlines and
// closed-peer errors as the UCX transport.
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>

#include "backends.h"

namespace deltaserve::transport {
namespace {

size_t message_bytes(const Message& m) { return m.header.size() + m.payload.size(); }

// One direction of a connection.
struct Channel {
    std::deque<Message> queue;
    size_t queued_bytes = 0;
    bool writer_closed = false;
    bool reader_closed = false;
    std::condition_variable readable;  // a message arrived or the writer closed
    std::condition_variable writable;  // room in the window or the reader closed
};

struct Pair {
    std::mutex mu;
    Channel to_server;
    Channel to_client;
};

class InprocConnection final : public Connection {
  public:
    InprocConnection(std::shared_ptr<Pair> pair, bool is_client, std::string peer,
                     const TransportOptions& options)
        : pair_(std::move(pair)),
          out_(is_client ? pair_->to_server : pair_->to_client),
          in_(is_client ? pair_->to_client : pair_->to_server),
          peer_(std::move(peer)),
          window_(options.send_window_bytes) {}
    ~InprocConnection() override { close(); }

    Status send(Message message, Deadline deadline) override {
        if (message.header.size() > kMaxHeaderBytes) {
            return invalid_argument("message header of " + std::to_string(message.header.size()) +
                                    " bytes exceeds " + std::to_string(kMaxHeaderBytes));
        }
        std::unique_lock lock(pair_->mu);
        // An empty queue takes any message, so one larger than the window still goes.
        const bool ready = out_.writable.wait_until(lock, deadline, [&] {
            return closed_ || out_.reader_closed || out_.queue.empty() ||
                   out_.queued_bytes + message_bytes(message) <= window_;
        });
        if (closed_) return unavailable_closed();
        if (out_.reader_closed)
            return Status(StatusCode::kUnavailable, "peer " + peer_ + " closed the connection");
        if (!ready) {
            return Status(StatusCode::kDeadlineExceeded,
                          "send window to " + peer_ + " stayed full (" +
                              std::to_string(out_.queued_bytes) + " bytes unreceived)");
        }
        stats_.messages_sent++;
        stats_.bytes_sent += message_bytes(message);
        out_.queued_bytes += message_bytes(message);
        out_.queue.push_back(std::move(message));
        out_.readable.notify_all();
        return {};
    }

    Status flush(Deadline) override {
        std::lock_guard lock(pair_->mu);
        if (closed_) return unavailable_closed();
        return {};  // queued is delivered: the peer's transport holds it
    }

    Result<Message> receive(Deadline deadline) override {
        std::unique_lock lock(pair_->mu);
        const bool ready = in_.readable.wait_until(
            lock, deadline, [&] { return closed_ || !in_.queue.empty() || in_.writer_closed; });
        if (closed_) return unavailable_closed();
        if (!in_.queue.empty()) {
            Message m = std::move(in_.queue.front());
            in_.queue.pop_front();
            in_.queued_bytes -= message_bytes(m);
            stats_.messages_received++;
            stats_.bytes_received += message_bytes(m);
            in_.writable.notify_all();
            return m;
        }
        if (in_.writer_closed) {
            return Status(StatusCode::kUnavailable, "peer " + peer_ + " closed the connection");
        }
        (void)ready;
        return Status(StatusCode::kDeadlineExceeded, "no message from " + peer_ + " in time");
    }

    void close() override {
        std::lock_guard lock(pair_->mu);
        if (closed_) return;
        closed_ = true;
        out_.writer_closed = true;
        in_.reader_closed = true;
        in_.queue.clear();  // nobody will read them; their buffers go back to the pool
        in_.queued_bytes = 0;
        out_.readable.notify_all();
        in_.writable.notify_all();
        in_.readable.notify_all();
        out_.writable.notify_all();
    }

    std::string peer() const override { return peer_; }

    Status status() const override {
        std::lock_guard lock(pair_->mu);
        if (closed_) return unavailable_closed();
        if (out_.reader_closed || in_.writer_closed) {
            return Status(StatusCode::kUnavailable, "peer " + peer_ + " closed the connection");
        }
        return {};
    }

    ConnectionStats stats() const override {
        std::lock_guard lock(pair_->mu);
        return stats_;
    }

  private:
    Status unavailable_closed() const {
        return Status(StatusCode::kUnavailable, "connection to " + peer_ + " was closed");
    }

    std::shared_ptr<Pair> pair_;
    Channel& out_;
    Channel& in_;
    std::string peer_;
    size_t window_;
    bool closed_ = false;  // guarded by pair_->mu
    ConnectionStats stats_;
};

struct ListenerState {
    std::mutex mu;
    std::condition_variable arrived;
    std::deque<std::unique_ptr<Connection>> pending;
    bool closed = false;
};

struct Registry {
    std::mutex mu;
    std::map<std::string, std::weak_ptr<ListenerState>, std::less<>> listeners;
};

class InprocListener final : public Listener {
  public:
    InprocListener(std::shared_ptr<Registry> registry, std::shared_ptr<ListenerState> state,
                   std::string name)
        : registry_(std::move(registry)), state_(std::move(state)), name_(std::move(name)) {}

    ~InprocListener() override {
        {
            std::lock_guard lock(registry_->mu);
            registry_->listeners.erase(name_);
        }
        std::lock_guard lock(state_->mu);
        state_->closed = true;
        state_->pending.clear();
        state_->arrived.notify_all();
    }

    Result<std::unique_ptr<Connection>> accept(Deadline deadline) override {
        std::unique_lock lock(state_->mu);
        state_->arrived.wait_until(lock, deadline,
                                   [&] { return state_->closed || !state_->pending.empty(); });
        if (!state_->pending.empty()) {
            auto c = std::move(state_->pending.front());
            state_->pending.pop_front();
            return c;
        }
        if (state_->closed) return Status(StatusCode::kUnavailable, "listener closed");
        return Status(StatusCode::kDeadlineExceeded,
                      "no connection to inproc:" + name_ + " in time");
    }

    std::string address() const override { return name_; }

  private:
    std::shared_ptr<Registry> registry_;
    std::shared_ptr<ListenerState> state_;
    std::string name_;
};

class InprocTransport final : public Transport {
  public:
    InprocTransport(const TransportOptions& options, std::shared_ptr<BufferPool> pool)
        : options_(options), pool_(std::move(pool)), registry_(std::make_shared<Registry>()) {}

    std::string_view name() const override { return "inproc"; }

    Result<std::unique_ptr<Listener>> listen(std::string_view address) override {
        if (address.empty()) return invalid_argument("an inproc address needs a name");
        std::lock_guard lock(registry_->mu);
        auto it = registry_->listeners.find(address);
        if (it != registry_->listeners.end() && !it->second.expired()) {
            return Status(StatusCode::kAlreadyExists,
                          "inproc:" + std::string(address) + " is already listened on");
        }
        auto state = std::make_shared<ListenerState>();
        registry_->listeners[std::string(address)] = state;
        return std::unique_ptr<Listener>(
            new InprocListener(registry_, std::move(state), std::string(address)));
    }

    Result<std::unique_ptr<Connection>> connect(std::string_view address, Deadline) override {
        std::shared_ptr<ListenerState> state;
        {
            std::lock_guard lock(registry_->mu);
            auto it = registry_->listeners.find(address);
            if (it != registry_->listeners.end()) state = it->second.lock();
        }
        if (!state) {
            return Status(StatusCode::kUnavailable,
                          "nothing listens on inproc:" + std::string(address));
        }
        auto pair = std::make_shared<Pair>();
        const int id = next_id_++;
        auto client = std::make_unique<InprocConnection>(
            pair, true, "inproc:" + std::string(address), options_);
        auto server = std::make_unique<InprocConnection>(
            pair, false, "inproc:client-" + std::to_string(id), options_);
        std::lock_guard lock(state->mu);
        if (state->closed)
            return Status(StatusCode::kUnavailable, "inproc:" + std::string(address) + " closed");
        state->pending.push_back(std::move(server));
        state->arrived.notify_all();
        return std::unique_ptr<Connection>(std::move(client));
    }

    TransportStats stats() const override { return {pool_->capacity(), pool_->bytes_in_use()}; }

    Result<Buffer> allocate(size_t bytes, Deadline deadline) override {
        return pool_->acquire(bytes, deadline);
    }

  private:
    TransportOptions options_;
    std::shared_ptr<BufferPool> pool_;
    std::shared_ptr<Registry> registry_;
    std::atomic<int> next_id_{1};
};

}  // namespace

Result<std::unique_ptr<Transport>> make_inproc_transport(const TransportOptions& options) {
    DS_ASSIGN_OR_RETURN(auto pool, BufferPool::create(options.pool_bytes));
    return std::unique_ptr<Transport>(new InprocTransport(options, std::move(pool)));
}

}  // namespace deltaserve::transport
