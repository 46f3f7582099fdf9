// The UCX backend's core: one UCP context and worker, driven by one progress thread.
//
// Every UCP call on the worker happens on the progress thread (the worker is created
// single-threaded); the application's threads post work to it and wait on the
// connection's condition variable. Connections speak three active messages: a hello from
// the client, the server's answer (the client's connect() returns when it arrives: the
// whole path works both ways), and data (header + payload). Payloads at or above UCX's
// rendezvous threshold are fetched only while the connection's receive window has room:
// until then the sender's request stays open, which is what stalls a fast sender. Between
// processes of one host, payloads from the pool travel through shared memory instead
// (shared_pool.h): the data message carries the payload's place in the sender's pool, the
// receiver copies it out under the same window and acknowledges.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "deltaserve/transport/transport_factory.h"
#include "shared_pool.h"

namespace deltaserve::transport {

struct UcxSendOp;

// A received message, in arrival order: ready, or a payload still at the sender (a
// rendezvous, or a place in the sender's shared pool).
struct Arrival {
    enum class State { kReady, kWaiting, kFetching };
    State state = State::kReady;
    uint64_t seq = 0;
    Message message;
    void* desc = nullptr;  // kWaiting: UCX's rendezvous descriptor
    size_t length = 0;     // payload bytes
    bool shared = false;   // the payload is at ref in the peer's pool
    PoolRef ref;
};

// One connection's state, shared by the application's threads and the progress thread.
struct UcxConn {
    explicit UcxConn(std::string peer_name) : peer(std::move(peer_name)) {}

    std::mutex mu;
    std::condition_variable changed;
    // Guarded by mu.
    std::string peer;
    std::deque<Arrival> arrivals;
    size_t held_bytes = 0;  // ready + being fetched: what the receive window counts
    uint64_t next_seq = 0;
    uint64_t next_fetch_seq = 0;  // arrivals before it are ready or being fetched
    size_t inflight_bytes = 0;
    size_t inflight = 0;
    Status error;             // the first failure; OK while the connection works
    bool connected = false;   // client: hello answered; server: hello arrived
    bool closing = false;     // the application closed it
    bool released = false;    // endpoint closed and every request on it finished
    bool wants_room = false;  // payloads wait for the receive window
    bool shared = false;      // payloads go through the shared pool (a same-host peer)
    ConnectionStats stats;

    // Progress thread only.
    class UcxCore* core = nullptr;
    ucp_ep_h ep = nullptr;
    bool failed = false;
    bool fetch_queued = false;                    // in UcxCore::to_fetch_
    size_t pending_ops = 0;                       // its sends and fetches not yet completed
    bool ep_closing = false;                      // its close request is in UcxCore::closing_
    bool ep_closed = false;                       // closed (or never opened)
    struct UcxListenerState* listener = nullptr;  // server side, until the hello
    std::unique_ptr<PeerPool> peer_pool;          // the peer's pool, mapped: it sends through it
    bool send_shared = false;                     // the peer maps our pool: send through it
    uint64_t next_shared_seq = 0;
    std::deque<UcxSendOp*> unacked;  // shared sends the peer has not copied yet, in order
};

struct UcxListenerState {
    std::mutex mu;
    std::condition_variable arrived;
    std::deque<std::shared_ptr<UcxConn>> accepted;  // guarded by mu
    bool closed = false;                            // guarded by mu
    std::string address;
    // Progress thread only.
    class UcxCore* core = nullptr;
    ucp_listener_h handle = nullptr;
};

class UcxCore {
  public:
    static Result<std::shared_ptr<UcxCore>> start(const TransportOptions& options);
    ~UcxCore();  // force-closes every endpoint, stops the thread, destroys the worker

    UcxCore(const UcxCore&) = delete;
    UcxCore& operator=(const UcxCore&) = delete;

    // Runs fn on the progress thread.
    void post(std::function<void()> fn);
    // Runs fn on the progress thread and waits for its answer.
    Status call(std::function<Status()> fn);
    // Wakes the progress thread (a receive made room in a window).
    void wake();

    const TransportOptions& options() const { return options_; }
    BufferPool& pool() { return *pool_; }
    const BufferPool& pool() const { return *pool_; }

    // Progress thread only.
    Status open_listener(const std::shared_ptr<UcxListenerState>& listener,
                         const sockaddr_storage& addr, socklen_t addr_len);
    void close_listener(const std::shared_ptr<UcxListenerState>& listener);
    Status open_client(const std::shared_ptr<UcxConn>& conn, const sockaddr_storage& addr,
                       socklen_t addr_len);
    void send(const std::shared_ptr<UcxConn>& conn, Message message, size_t bytes);
    void close(const std::shared_ptr<UcxConn>& conn, bool force);
    // Fetches conn's waiting payloads if its window has room now.
    void fetch_later(const std::shared_ptr<UcxConn>& conn);

  private:
    struct Handles;
    using SendOp = UcxSendOp;
    struct FetchOp;

    UcxCore() = default;
    void run();
    bool progress_once();
    void service();
    void fetch_waiting(const std::shared_ptr<UcxConn>& conn);
    void release_waiting(UcxConn& conn);
    void op_done(UcxConn& conn);
    void release_if_done(UcxConn& conn);
    void fail(UcxConn& conn, Status why);
    void send_control(const std::shared_ptr<UcxConn>& conn, unsigned id, const std::string& header);
    static ucp_request_param_t send_params(SendOp* op);
    void start_send(SendOp* op, unsigned id);
    void start_shared_send(SendOp* op);
    void cancel_unacked(UcxConn& conn);
    void use_shared(UcxConn& conn);
    std::string hello_offer() const;
    // Fails a connection whose peer announced a payload over options_.max_message_bytes.
    void refuse_oversized(const std::shared_ptr<UcxConn>& conn, size_t length);
    void on_fetched(FetchOp* op, ucs_status_t status);
    void part_done(SendOp* op, ucs_status_t status);
    void on_sent(SendOp* op, ucs_status_t status);
    std::shared_ptr<UcxConn> conn_of(ucp_ep_h ep);

    static void on_conn_request(ucp_conn_request_h request, void* arg);
    static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status);
    static ucs_status_t on_hello(void* arg, const void* header, size_t header_length, void* data,
                                 size_t length, const ucp_am_recv_param_t* param);
    static ucs_status_t on_hello_answer(void* arg, const void* header, size_t header_length,
                                        void* data, size_t length,
                                        const ucp_am_recv_param_t* param);
    static ucs_status_t on_data(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param);
    static ucs_status_t on_shared_data(void* arg, const void* header, size_t header_length,
                                       void* data, size_t length,
                                       const ucp_am_recv_param_t* param);
    static ucs_status_t on_shared_ack(void* arg, const void* header, size_t header_length,
                                      void* data, size_t length, const ucp_am_recv_param_t* param);
    static ucs_status_t on_shared_ready(void* arg, const void* header, size_t header_length,
                                        void* data, size_t length,
                                        const ucp_am_recv_param_t* param);
    static void on_send_done(void* request, ucs_status_t status, void* user_data);
    static void on_fetch_done(void* request, ucs_status_t status, size_t length, void* user_data);

    TransportOptions options_;
    std::shared_ptr<Handles> handles_;  // context + worker; the pool's deregistration holds it
    std::shared_ptr<BufferPool> pool_;
    int event_fd_ = -1;
    std::optional<PoolOffer> offer_;  // set where peers on this host may map our pool
    std::thread thread_;

    std::mutex commands_mu_;
    std::deque<std::function<void()>> commands_;  // guarded by commands_mu_
    std::atomic<bool> wake_pending_{false};
    std::atomic<bool> stopping_{false};
    std::atomic<bool> sleeping_{false};  // the progress thread waits on the event fd

    // Progress thread only.
    size_t ops_in_flight_ = 0;  // sends and rendezvous fetches not yet completed
    std::unordered_map<ucp_ep_h, std::shared_ptr<UcxConn>> eps_;
    std::vector<std::shared_ptr<UcxConn>> failed_;    // endpoints to force-close
    std::vector<std::shared_ptr<UcxConn>> to_fetch_;  // have waiting arrivals
    struct Closing {
        void* request;
        std::shared_ptr<UcxConn> conn;
    };
    std::vector<Closing> closing_;
    std::vector<std::shared_ptr<UcxListenerState>> listeners_;
};

}  // namespace deltaserve::transport
