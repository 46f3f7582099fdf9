#include "ucx_core.h"

#include <arpa/inet.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <future>
#include <mutex>

#include "deltaserve/common/logging.h"
#include "ucx_status.h"

namespace deltaserve::transport {
namespace {

enum AmId : unsigned {
    kAmHello = 1,
    kAmHelloAnswer = 2,
    kAmData = 3,
    kAmSharedData = 4,   // header + PoolRef; the payload is in the sender's pool
    kAmSharedAck = 5,    // the receiver copied every shared payload up to this seq
    kAmSharedReady = 6,  // the client mapped the server's pool: the server may send through it
};

// Payloads from the pool at least this large go through the shared pool on one host;
// smaller ones travel inside UCX's own message as before (a copy either way).
constexpr size_t kSharedMinBytes = 8 << 10;

// After activity the progress thread keeps polling this long before it sleeps on the
// worker's event fd: a stream of messages does not pay a wakeup per message.
constexpr auto kSpin = std::chrono::microseconds(200);
// With transfers under way it polls this long after the last progress.
constexpr auto kBusyPoll = std::chrono::milliseconds(20);
// The longest sleep: close grace periods are checked at least this often.
constexpr int kSleepMs = 50;

std::string sockaddr_name(const sockaddr_storage& ss) {
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (ss.ss_family == AF_INET) {
        const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
        port = ntohs(in->sin_port);
        return std::string(host) + ":" + std::to_string(port);
    }
    if (ss.ss_family == AF_INET6) {
        const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
        port = ntohs(in6->sin6_port);
        std::string name = "[";
        name += host;
        name += "]:";
        name += std::to_string(port);
        return name;
    }
    return "?";
}

// A node started again on its address must not wait out its old connections' TIME_WAIT
// (a minute on Linux): UCX's TCP connection manager binds its listener with SO_REUSEADDR
// only when told, and reads that from the environment alone (ucp_config_modify does not
// reach connection managers in UCX 1.13). The operator's own setting wins.
void allow_listen_address_reuse() {
    static std::once_flag once;
    std::call_once(once, [] { setenv("UCX_TCP_CM_REUSEADDR", "y", 0); });
}

}  // namespace

struct UcxCore::Handles {
    ucp_context_h context = nullptr;
    ucp_worker_h worker = nullptr;
    ~Handles() {
        if (worker) ucp_worker_destroy(worker);
        if (context) ucp_cleanup(context);
    }
};

struct UcxSendOp {
    class UcxCore* core;
    std::shared_ptr<UcxConn> conn;
    Message message;
    size_t bytes;
    bool data;  // counted in the connection's in-flight totals (hello and answer are not)
    // A shared send finishes when UCX has sent its reference and the peer acknowledged the
    // copy (or the connection ended): two parts.
    int parts = 1;
    uint64_t shared_seq = 0;
    ucs_status_t status = UCS_OK;  // the first failure of a part
};

struct UcxCore::FetchOp {
    UcxCore* core;
    std::shared_ptr<UcxConn> conn;
    uint64_t seq;
    Buffer buffer;
};

// ---- start and stop ----

Result<std::shared_ptr<UcxCore>> UcxCore::start(const TransportOptions& options) {
    std::shared_ptr<UcxCore> core(new UcxCore());
    core->options_ = options;
    core->handles_ = std::make_shared<Handles>();

    allow_listen_address_reuse();
    ucp_config_t* config = nullptr;
    ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
    if (s != UCS_OK) return ucx_status(s, "reading UCX configuration");
    if (!options.ucx_tls.empty()) {
        std::string tls = options.ucx_tls;
        if (tls.find("tcp") == std::string::npos && tls != "all") tls += ",tcp";
        s = ucp_config_modify(config, "TLS", tls.c_str());
        if (s != UCS_OK) {
            ucp_config_release(config);
            return ucx_status(s, "setting UCX transports to '" + tls + "'");
        }
    }
    const std::string keepalive = std::to_string(options.keepalive.count()) + "ms";
    (void)ucp_config_modify(config, "KEEPALIVE_INTERVAL", keepalive.c_str());
    // Shared-memory transports leave endpoints that need peer-failure handling unless told
    // they may handle it (UCX issue 8477): without this, same-host peers talk over tcp.
    // (Where none is loaded, UCX warns of the unknown setting.)
    if (ucx_tls_has_shared_memory(options.ucx_tls)) {
        (void)ucp_config_modify(config, "MM_ERROR_HANDLING", "y");
    }
    // UCX_RNDV_SCHEME from the environment is already in config and wins.
    if (std::getenv("UCX_RNDV_SCHEME") == nullptr && !options.ucx_rndv_scheme.empty()) {
        s = ucp_config_modify(config, "RNDV_SCHEME", options.ucx_rndv_scheme.c_str());
        if (s != UCS_OK) {
            ucp_config_release(config);
            return ucx_status(
                s, "setting UCX's rendezvous scheme to '" + options.ucx_rndv_scheme + "'");
        }
    }

    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
    params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    params.name = "deltaserve";
    s = ucp_init(&params, config, &core->handles_->context);
    ucp_config_release(config);
    if (s != UCS_OK) return ucx_status(s, "starting UCX");

    ucp_worker_params_t wparams{};
    wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wparams.thread_mode = UCS_THREAD_MODE_SINGLE;
    s = ucp_worker_create(core->handles_->context, &wparams, &core->handles_->worker);
    if (s != UCS_OK) return ucx_status(s, "creating a UCX worker");
    ucp_worker_h worker = core->handles_->worker;

    ucp_worker_attr_t wattr{};
    wattr.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
    s = ucp_worker_query(worker, &wattr);
    if (s != UCS_OK) return ucx_status(s, "querying the UCX worker");
    if (wattr.max_am_header < kMaxHeaderBytes) {
        return Status(StatusCode::kUnavailable, "UCX allows active-message headers of " +
                                                    std::to_string(wattr.max_am_header) +
                                                    " bytes, fewer than " +
                                                    std::to_string(kMaxHeaderBytes));
    }
    s = ucp_worker_get_efd(worker, &core->event_fd_);
    if (s != UCS_OK) return ucx_status(s, "getting the UCX worker's event fd");

    const std::pair<unsigned, ucp_am_recv_callback_t> handlers[] = {
        {kAmHello, &UcxCore::on_hello},
        {kAmHelloAnswer, &UcxCore::on_hello_answer},
        {kAmData, &UcxCore::on_data},
        {kAmSharedData, &UcxCore::on_shared_data},
        {kAmSharedAck, &UcxCore::on_shared_ack},
        {kAmSharedReady, &UcxCore::on_shared_ready}};
    for (const auto& [id, cb] : handlers) {
        ucp_am_handler_param_t h{};
        h.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                       UCP_AM_HANDLER_PARAM_FIELD_ARG;
        h.id = id;
        h.cb = cb;
        h.arg = core.get();
        s = ucp_worker_set_am_recv_handler(worker, &h);
        if (s != UCS_OK) return ucx_status(s, "registering an active-message handler");
    }

    // Peers on this host may map the pool where the transports allow shared memory.
    const bool shared = ucx_tls_has_shared_memory(options.ucx_tls);
    const std::string pool_name = shared ? random_pool_name() : std::string();
    std::shared_ptr<Handles> handles = core->handles_;
    auto pool = BufferPool::create(
        options.pool_bytes,
        [handles](std::span<std::byte> region) -> Result<void*> {
            ucp_mem_map_params_t mp{};
            mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
            mp.address = region.data();
            mp.length = region.size();
            ucp_mem_h memh = nullptr;
            ucs_status_t ms = ucp_mem_map(handles->context, &mp, &memh);
            if (ms != UCS_OK) return ucx_status(ms, "ucp_mem_map");
            return static_cast<void*>(memh);
        },
        [handles](void* memh) { ucp_mem_unmap(handles->context, static_cast<ucp_mem_h>(memh)); },
        pool_name);
    if (!pool.ok()) return pool.error();
    core->pool_ = std::move(*pool);
    if (core->pool_->share_fd() >= 0) {
        core->offer_ =
            PoolOffer{getpid(), core->pool_->share_fd(), core->pool_->capacity(), pool_name};
    }

    core->thread_ = std::thread([c = core.get()] { c->run(); });
    return core;
}

UcxCore::~UcxCore() {
    stopping_ = true;
    wake();
    if (thread_.joinable()) thread_.join();
    // handles_ goes last (after the pool, which may still be held by buffers in flight).
}

void UcxCore::post(std::function<void()> fn) {
    {
        std::lock_guard lock(commands_mu_);
        commands_.push_back(std::move(fn));
    }
    wake();
}

Status UcxCore::call(std::function<Status()> fn) {
    auto done = std::make_shared<std::promise<Status>>();
    auto result = done->get_future();
    post([fn = std::move(fn), done] { done->set_value(fn()); });
    return result.get();
}

void UcxCore::wake() {
    wake_pending_ = true;
    // A polling progress thread picks the work up by itself: spare it the system call.
    if (sleeping_) ucp_worker_signal(handles_->worker);
}

// ---- the progress thread ----

void UcxCore::run() {
    ucp_worker_h worker = handles_->worker;
    auto last_activity = Clock::now();
    while (!stopping_) {
        if (progress_once()) last_activity = Clock::now();
        const auto idle = Clock::now() - last_activity;
        // Poll while transfers move (a sleep per message halves the bandwidth), yielding so
        // the application's threads get the core; a transfer stalled on a slow peer sleeps.
        if (ops_in_flight_ > 0 && idle < kBusyPoll) {
            std::this_thread::yield();
            continue;
        }
        if (idle < kSpin) continue;
        if (ucp_worker_arm(worker) == UCS_ERR_BUSY) continue;
        // Announce the sleep, then look for work posted meanwhile: a poster either sees
        // sleeping_ and signals the worker, or its work is seen here (both seq_cst).
        sleeping_ = true;
        if (wake_pending_.exchange(false)) {
            sleeping_ = false;
            continue;
        }
        pollfd pfd{event_fd_, POLLIN, 0};
        (void)poll(&pfd, 1, kSleepMs);
        sleeping_ = false;
    }
    // Shutting down: force-close what is left and give the requests a moment to finish.
    for (auto& l : std::vector(listeners_)) close_listener(l);  // close_listener erases
    std::vector<std::shared_ptr<UcxConn>> open;
    for (auto& [ep, conn] : eps_) open.push_back(conn);
    for (auto& conn : open) close(conn, /*force=*/true);
    const auto until = Clock::now() + std::chrono::seconds(1);
    while (!closing_.empty() && Clock::now() < until) progress_once();
    for (auto& c : closing_) {
        std::lock_guard lock(c.conn->mu);
        c.conn->released = true;
        c.conn->changed.notify_all();
    }
    std::lock_guard lock(commands_mu_);
    commands_.clear();
}

bool UcxCore::progress_once() {
    std::deque<std::function<void()>> commands;
    {
        std::lock_guard lock(commands_mu_);
        commands.swap(commands_);
    }
    bool active = !commands.empty();
    for (auto& fn : commands) fn();
    while (ucp_worker_progress(handles_->worker) != 0) active = true;
    service();
    return active;
}

// Work that must not run inside UCX callbacks: closing failed endpoints, fetching
// rendezvous payloads the windows now allow, finishing closes.
void UcxCore::service() {
    auto failed = std::move(failed_);
    failed_.clear();
    for (auto& conn : failed) close(conn, /*force=*/true);

    auto fetch = std::move(to_fetch_);
    to_fetch_.clear();
    for (auto& conn : fetch) fetch_waiting(conn);

    for (size_t i = 0; i < closing_.size();) {
        if (ucp_request_check_status(closing_[i].request) == UCS_INPROGRESS) {
            ++i;
            continue;
        }
        ucp_request_free(closing_[i].request);
        std::shared_ptr<UcxConn> conn = std::move(closing_[i].conn);
        closing_.erase(closing_.begin() + static_cast<ptrdiff_t>(i));
        conn->ep_closing = false;
        release_if_done(*conn);
    }
}

std::shared_ptr<UcxConn> UcxCore::conn_of(ucp_ep_h ep) {
    auto it = eps_.find(ep);
    return it == eps_.end() ? nullptr : it->second;
}

void UcxCore::fail(UcxConn& conn, Status why) {
    {
        std::lock_guard lock(conn.mu);
        if (conn.error.ok()) conn.error = std::move(why);
    }
    conn.changed.notify_all();
}

// ---- listeners and endpoints ----

Status UcxCore::open_listener(const std::shared_ptr<UcxListenerState>& listener,
                              const sockaddr_storage& addr, socklen_t addr_len) {
    ucp_listener_params_t lp{};
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
    lp.sockaddr.addrlen = addr_len;
    lp.conn_handler.cb = &UcxCore::on_conn_request;
    lp.conn_handler.arg = listener.get();
    listener->core = this;
    ucs_status_t s = ucp_listener_create(handles_->worker, &lp, &listener->handle);
    if (s != UCS_OK) return ucx_status(s, "listening on " + sockaddr_name(addr));
    ucp_listener_attr_t attr{};
    attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    s = ucp_listener_query(listener->handle, &attr);
    if (s != UCS_OK) {
        ucp_listener_destroy(listener->handle);
        listener->handle = nullptr;
        return ucx_status(s, "querying the listener on " + sockaddr_name(addr));
    }
    listener->address = sockaddr_name(attr.sockaddr);
    listeners_.push_back(listener);
    return {};
}

void UcxCore::close_listener(const std::shared_ptr<UcxListenerState>& listener) {
    if (listener->handle) {
        ucp_listener_destroy(listener->handle);
        listener->handle = nullptr;
    }
    std::deque<std::shared_ptr<UcxConn>> unaccepted;
    {
        std::lock_guard lock(listener->mu);
        listener->closed = true;
        unaccepted.swap(listener->accepted);
    }
    listener->arrived.notify_all();
    for (auto& conn : unaccepted) close(conn, /*force=*/true);
    // Connections whose hello has not come yet must not reach the dead listener.
    for (auto& [ep, conn] : eps_) {
        if (conn->listener == listener.get()) conn->listener = nullptr;
    }
    std::erase(listeners_, listener);
}

void UcxCore::on_conn_request(ucp_conn_request_h request, void* arg) {
    auto* listener = static_cast<UcxListenerState*>(arg);
    UcxCore* core = listener->core;
    ucp_conn_request_attr_t attr{};
    attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
    std::string peer = "?";
    if (ucp_conn_request_query(request, &attr) == UCS_OK) peer = sockaddr_name(attr.client_address);

    auto conn = std::make_shared<UcxConn>(peer);
    conn->core = core;
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.conn_request = request;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = &UcxCore::on_ep_error;
    ep.err_handler.arg = conn.get();
    ucs_status_t s = ucp_ep_create(core->handles_->worker, &ep, &conn->ep);
    if (s != UCS_OK) {
        spdlog::warn("transport: refusing a connection from {}: {}", peer, ucs_status_string(s));
        return;
    }
    conn->listener = listener;
    core->eps_.emplace(conn->ep, std::move(conn));
}

Status UcxCore::open_client(const std::shared_ptr<UcxConn>& conn, const sockaddr_storage& addr,
                            socklen_t addr_len) {
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                    UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
    ep.sockaddr.addrlen = addr_len;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = &UcxCore::on_ep_error;
    ep.err_handler.arg = conn.get();
    conn->core = this;
    ucs_status_t s = ucp_ep_create(handles_->worker, &ep, &conn->ep);
    if (s != UCS_OK) return ucx_status(s, "connecting to " + sockaddr_name(addr));
    eps_.emplace(conn->ep, conn);
    send_control(conn, kAmHello, "hello" + hello_offer());
    return {};
}

void UcxCore::on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status) {
    auto* conn = static_cast<UcxConn*>(arg);
    UcxCore* core = conn->core;
    std::string peer;
    {
        std::lock_guard lock(conn->mu);
        peer = conn->peer;
    }
    core->fail(*conn, Status(StatusCode::kUnavailable,
                             "connection to " + peer + " lost: " + ucs_status_string(status)));
    auto shared = core->conn_of(ep);
    if (shared && !conn->failed) {
        conn->failed = true;
        core->failed_.push_back(std::move(shared));
    }
}

// The connection is released once its endpoint is closed and its requests have finished
// (a forced close completes them with an error): until then they may hold pool buffers.
void UcxCore::release_if_done(UcxConn& conn) {
    conn.ep_closed = true;
    if (conn.pending_ops > 0) return;
    {
        std::lock_guard lock(conn.mu);
        conn.released = true;
    }
    conn.changed.notify_all();
}

void UcxCore::op_done(UcxConn& conn) {
    --ops_in_flight_;
    --conn.pending_ops;
    if (conn.ep_closed) release_if_done(conn);
}

void UcxCore::close(const std::shared_ptr<UcxConn>& conn, bool force) {
    if (conn->ep == nullptr) {
        // Never opened, or closed already (a failed endpoint is force-closed at once): the
        // close under way, if any, releases it.
        if (!conn->ep_closing) release_if_done(*conn);
        return;
    }
    release_waiting(*conn);
    cancel_unacked(*conn);
    ucp_ep_h ep = std::exchange(conn->ep, nullptr);
    eps_.erase(ep);
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    void* request = ucp_ep_close_nbx(ep, &p);
    if (request != nullptr && !UCS_PTR_IS_ERR(request)) {
        conn->ep_closing = true;
        closing_.push_back({request, conn});
        return;
    }
    release_if_done(*conn);
}

// Rendezvous payloads nobody will fetch go back to UCX.
void UcxCore::release_waiting(UcxConn& conn) {
    std::vector<void*> descs;
    {
        std::lock_guard lock(conn.mu);
        for (auto& a : conn.arrivals) {
            if (a.state == Arrival::State::kWaiting && a.desc)
                descs.push_back(std::exchange(a.desc, nullptr));
        }
    }
    for (void* d : descs) ucp_am_data_release(handles_->worker, d);
}

// ---- sending ----

void UcxCore::send_control(const std::shared_ptr<UcxConn>& conn, unsigned id,
                           const std::string& header) {
    Message m;
    m.header.resize(header.size());
    std::memcpy(m.header.data(), header.data(), header.size());
    start_send(new SendOp{this, conn, std::move(m), 0, /*data=*/false}, id);
}

// A send completing through on_send_done, which may answer to the peer's endpoint.
ucp_request_param_t UcxCore::send_params(SendOp* op) {
    ucp_request_param_t p{};
    p.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    p.cb.send = &UcxCore::on_send_done;
    p.user_data = op;
    p.flags = UCP_AM_SEND_FLAG_REPLY;
    return p;
}

void UcxCore::send(const std::shared_ptr<UcxConn>& conn, Message message, size_t bytes) {
    auto* op = new SendOp{this, conn, std::move(message), bytes, /*data=*/true};
    const Buffer& payload = op->message.payload;
    if (conn->send_shared && conn->ep != nullptr && !conn->failed &&
        payload.pool() == pool_.get() && payload.size() >= kSharedMinBytes) {
        return start_shared_send(op);
    }
    start_send(op, kAmData);
}

// The reference goes as a UCX message; the payload stays in the pool until the ack.
void UcxCore::start_shared_send(SendOp* op) {
    UcxConn& conn = *op->conn;
    op->parts = 2;
    op->shared_seq = conn.next_shared_seq++;
    const Buffer& payload = op->message.payload;
    append_ref(op->message.header,
               PoolRef{pool_->offset_of(payload.data()), payload.size(), op->shared_seq});
    conn.unacked.push_back(op);
    {
        std::lock_guard lock(conn.mu);
        conn.stats.shared_sent++;
    }
    ++ops_in_flight_;
    ++conn.pending_ops;
    ucp_request_param_t p = send_params(op);
    void* r = ucp_am_send_nbx(conn.ep, kAmSharedData, op->message.header.data(),
                              op->message.header.size(), nullptr, 0, &p);
    if (r == nullptr) return part_done(op, UCS_OK);
    if (UCS_PTR_IS_ERR(r)) {
        // Not sent: the peer will not acknowledge it either.
        std::erase(conn.unacked, op);
        op->parts = 1;
        part_done(op, UCS_PTR_STATUS(r));
    }
}

void UcxCore::use_shared(UcxConn& conn) {
    conn.send_shared = true;
    std::lock_guard lock(conn.mu);
    conn.shared = true;
}

// Shared sends the peer will not acknowledge now (the connection is closing or failed).
void UcxCore::cancel_unacked(UcxConn& conn) {
    auto unacked = std::move(conn.unacked);
    conn.unacked.clear();
    for (SendOp* op : unacked) part_done(op, UCS_ERR_CANCELED);
}

void UcxCore::start_send(SendOp* op, unsigned id) {
    ++ops_in_flight_;
    ++op->conn->pending_ops;
    if (op->conn->ep == nullptr || op->conn->failed) return on_sent(op, UCS_ERR_NOT_CONNECTED);
    ucp_request_param_t p = send_params(op);
    Buffer& payload = op->message.payload;
    if (payload.pool() == pool_.get() && pool_->registration() != nullptr) {
        p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
        p.memh = static_cast<ucp_mem_h>(pool_->registration());
    }
    void* r = ucp_am_send_nbx(op->conn->ep, id, op->message.header.data(),
                              op->message.header.size(), payload.data(), payload.size(), &p);
    if (r == nullptr) return on_sent(op, UCS_OK);
    if (UCS_PTR_IS_ERR(r)) return on_sent(op, UCS_PTR_STATUS(r));
}

void UcxCore::on_send_done(void* request, ucs_status_t status, void* user_data) {
    auto* op = static_cast<SendOp*>(user_data);
    op->core->part_done(op, status);
    ucp_request_free(request);
}

void UcxCore::part_done(SendOp* op, ucs_status_t status) {
    if (status != UCS_OK && op->status == UCS_OK) op->status = status;
    if (--op->parts > 0) return;
    on_sent(op, op->status);
}

void UcxCore::on_sent(SendOp* op, ucs_status_t status) {
    std::unique_ptr<SendOp> owned(op);
    UcxConn& conn = *op->conn;
    // Its buffer goes back to the pool before the completion is announced: once flush()
    // returns, what was sent no longer holds the pool.
    op->message = {};
    bool notify = true;
    {
        std::lock_guard lock(conn.mu);
        if (op->data) {
            conn.inflight_bytes -= op->bytes;
            conn.inflight--;
        }
        if (status != UCS_OK && conn.error.ok()) {
            conn.error = ucx_status(status, "sending to " + conn.peer);
            if (conn.error.code() != StatusCode::kUnavailable) {
                conn.error = Status(StatusCode::kUnavailable, conn.error.message());
            }
        }
        // A sender waiting for room is woken once half the window is free, not at every
        // completion: a full window of small messages would cost a wakeup each.
        const size_t window =
            conn.shared ? options_.shared_send_window_bytes : options_.send_window_bytes;
        notify = !conn.error.ok() || conn.inflight == 0 || conn.inflight_bytes <= window / 2;
    }
    if (notify) conn.changed.notify_all();
    op_done(conn);
}

// ---- receiving ----

// " shm <pid> <fd> <size> <name>" where peers on this host may map our pool, else "".
std::string UcxCore::hello_offer() const {
    std::string text;
    if (offer_) text.append(" ").append(encode_offer(*offer_));
    return text;
}

namespace {

// The peer's pool where it offered one and this process can map it (same host).
std::unique_ptr<PeerPool> map_offered(const void* header, size_t length) {
    auto offer = parse_offer(std::string_view(static_cast<const char*>(header), length));
    if (!offer) return nullptr;
    auto mapped = PeerPool::map(*offer);
    if (!mapped.ok()) {
        spdlog::debug("transport: payloads go through UCX: {}", mapped.error().message());
        return nullptr;
    }
    spdlog::debug(
        "transport: mapped the pool of process {} (same host): its payloads come "
        "through it",
        offer->pid);
    return std::move(*mapped);
}

}  // namespace

// The hello may offer the client's pool; the answer says whether the server mapped it and
// offers the server's.
ucs_status_t UcxCore::on_hello(void* arg, const void* header, size_t header_length, void*, size_t,
                               const ucp_am_recv_param_t* param) {
    auto* core = static_cast<UcxCore*>(arg);
    auto conn = core->conn_of(param->reply_ep);
    if (!conn || conn->listener == nullptr) return UCS_OK;
    UcxListenerState* listener = std::exchange(conn->listener, nullptr);
    if (core->offer_) conn->peer_pool = map_offered(header, header_length);
    core->send_control(
        conn, kAmHelloAnswer,
        std::string(conn->peer_pool ? "answer mapped" : "answer") + core->hello_offer());
    {
        std::lock_guard lock(conn->mu);
        conn->connected = true;
    }
    bool closed = false;
    {
        std::lock_guard lock(listener->mu);
        closed = listener->closed;
        if (!closed) listener->accepted.push_back(conn);
    }
    listener->arrived.notify_all();
    if (closed) core->failed_.push_back(conn);
    return UCS_OK;
}

ucs_status_t UcxCore::on_hello_answer(void* arg, const void* header, size_t header_length, void*,
                                      size_t, const ucp_am_recv_param_t* param) {
    auto* core = static_cast<UcxCore*>(arg);
    auto conn = core->conn_of(param->reply_ep);
    if (!conn) return UCS_OK;
    const std::string_view answer(static_cast<const char*>(header), header_length);
    if (core->offer_) {
        if (answer.rfind("answer mapped", 0) == 0) core->use_shared(*conn);
        conn->peer_pool = map_offered(header, header_length);
        // Sent before connect() returns, so it precedes every data message.
        if (conn->peer_pool) core->send_control(conn, kAmSharedReady, "ready");
    }
    {
        std::lock_guard lock(conn->mu);
        conn->connected = true;
    }
    conn->changed.notify_all();
    return UCS_OK;
}

ucs_status_t UcxCore::on_data(void* arg, const void* header, size_t header_length, void* data,
                              size_t length, const ucp_am_recv_param_t* param) {
    auto* core = static_cast<UcxCore*>(arg);
    auto conn = core->conn_of(param->reply_ep);
    if (!conn) return UCS_OK;  // an endpoint being closed: drop
    if (length > core->options_.max_message_bytes) {
        core->refuse_oversized(conn, length);
        return UCS_OK;
    }
    Arrival a;
    a.message.header.resize(header_length);
    if (header_length > 0) std::memcpy(a.message.header.data(), header, header_length);
    a.length = length;
    const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    if (rndv) {
        a.state = Arrival::State::kWaiting;
        a.desc = data;
    } else {
        Buffer b = core->pool_->try_acquire(length);
        if (b.data() == nullptr) b = Buffer::heap(length);
        if (length > 0) std::memcpy(b.data(), data, length);
        a.message.payload = std::move(b);
    }
    {
        std::lock_guard lock(conn->mu);
        a.seq = conn->next_seq++;
        if (!rndv) conn->held_bytes += length + header_length;
        conn->arrivals.push_back(std::move(a));
    }
    if (rndv) {
        core->fetch_later(conn);
        return UCS_INPROGRESS;
    }
    conn->changed.notify_all();
    return UCS_OK;
}

ucs_status_t UcxCore::on_shared_ready(void* arg, const void*, size_t, void*, size_t,
                                      const ucp_am_recv_param_t* param) {
    auto* core = static_cast<UcxCore*>(arg);
    auto conn = core->conn_of(param->reply_ep);
    if (conn && core->offer_) core->use_shared(*conn);
    return UCS_OK;
}

ucs_status_t UcxCore::on_shared_data(void* arg, const void* header, size_t header_length, void*,
                                     size_t, const ucp_am_recv_param_t* param) {
    auto* core = static_cast<UcxCore*>(arg);
    auto conn = core->conn_of(param->reply_ep);
    if (!conn) return UCS_OK;
    size_t app_length = 0;
    const auto ref = take_ref(header, header_length, &app_length);
    if (ref && ref->length > core->options_.max_message_bytes) {
        core->refuse_oversized(conn, ref->length);
        return UCS_OK;
    }
    if (!ref || !conn->peer_pool || conn->peer_pool->at(ref->offset, ref->length) == nullptr) {
        std::string peer;
        {
            std::lock_guard lock(conn->mu);
            peer = conn->peer;
        }
        core->fail(*conn, Status(StatusCode::kDataLoss,
                                 "connection to " + peer +
                                     ": a shared-memory payload outside the peer's pool"));
        if (!std::exchange(conn->failed, true)) core->failed_.push_back(conn);
        return UCS_OK;
    }
    Arrival a;
    a.message.header.resize(app_length);
    if (app_length > 0) std::memcpy(a.message.header.data(), header, app_length);
    a.state = Arrival::State::kWaiting;
    a.length = ref->length;
    a.shared = true;
    a.ref = *ref;
    {
        std::lock_guard lock(conn->mu);
        a.seq = conn->next_seq++;
        conn->arrivals.push_back(std::move(a));
    }
    core->fetch_later(conn);
    return UCS_OK;
}

ucs_status_t UcxCore::on_shared_ack(void* arg, const void* header, size_t header_length, void*,
                                    size_t, const ucp_am_recv_param_t* param) {
    auto* core = static_cast<UcxCore*>(arg);
    auto conn = core->conn_of(param->reply_ep);
    const auto seq = parse_ack(header, header_length);
    if (!conn || !seq) return UCS_OK;
    while (!conn->unacked.empty() && conn->unacked.front()->shared_seq <= *seq) {
        SendOp* op = conn->unacked.front();
        conn->unacked.pop_front();
        core->part_done(op, UCS_OK);
    }
    return UCS_OK;
}

void UcxCore::refuse_oversized(const std::shared_ptr<UcxConn>& conn, size_t length) {
    std::string peer;
    {
        std::lock_guard lock(conn->mu);
        peer = conn->peer;
    }
    fail(*conn, resource_exhausted("connection to " + peer + ": the peer announced a payload of " +
                                   std::to_string(length) + " bytes, more than the " +
                                   std::to_string(options_.max_message_bytes) + " allowed"));
    if (!std::exchange(conn->failed, true)) failed_.push_back(conn);
}

void UcxCore::fetch_later(const std::shared_ptr<UcxConn>& conn) {
    if (std::exchange(conn->fetch_queued, true)) return;
    to_fetch_.push_back(conn);
}

// Starts fetching the waiting payloads, in order, while the receive window has room (a
// window holding nothing takes one payload of any size).
void UcxCore::fetch_waiting(const std::shared_ptr<UcxConn>& conn) {
    conn->fetch_queued = false;
    if (conn->ep == nullptr) return;
    struct Pending {
        uint64_t seq;
        void* desc;
        size_t length;
        bool shared;  // the payload is at ref in the peer's pool
        PoolRef ref;
    };
    std::vector<Pending> start;
    bool more_waiting = false;
    {
        std::lock_guard lock(conn->mu);
        size_t held = conn->held_bytes;
        // Payloads are fetched in order: start after those already started (from the front,
        // the scan would cross every message the application has yet to take, per arrival).
        auto& arrivals = conn->arrivals;
        const uint64_t front = arrivals.empty() ? conn->next_seq : arrivals.front().seq;
        size_t i = conn->next_fetch_seq > front ? conn->next_fetch_seq - front : 0;
        for (; i < arrivals.size(); ++i) {
            Arrival& a = arrivals[i];
            if (a.state != Arrival::State::kWaiting) continue;
            if (held > 0 && held + a.length > options_.recv_window_bytes) {
                more_waiting = true;
                break;
            }
            a.state = Arrival::State::kFetching;
            held += a.length + a.message.header.size();
            start.push_back({a.seq, std::exchange(a.desc, nullptr), a.length, a.shared, a.ref});
        }
        conn->next_fetch_seq = i < arrivals.size() ? arrivals[i].seq : conn->next_seq;
        conn->held_bytes = held;
        conn->wants_room = more_waiting;
    }
    std::vector<std::pair<uint64_t, Buffer>> copied;
    uint64_t copied_upto = 0;
    for (const Pending& p : start) {
        Buffer b = pool_->try_acquire(p.length);
        if (b.data() == nullptr) b = Buffer::heap(p.length);
        if (p.shared) {
            // Its place was checked against the mapping when it arrived.
            std::memcpy(b.data(), conn->peer_pool->at(p.ref.offset, p.length), p.length);
            copied.emplace_back(p.seq, std::move(b));
            copied_upto = p.ref.seq;
            continue;
        }
        ++ops_in_flight_;
        ++conn->pending_ops;
        auto* op = new FetchOp{this, conn, p.seq, std::move(b)};
        ucp_request_param_t rp{};
        rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        rp.cb.recv_am = &UcxCore::on_fetch_done;
        rp.user_data = op;
        if (op->buffer.pool() == pool_.get() && pool_->registration() != nullptr) {
            rp.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
            rp.memh = static_cast<ucp_mem_h>(pool_->registration());
        }
        void* r = ucp_am_recv_data_nbx(handles_->worker, p.desc, op->buffer.data(), p.length, &rp);
        if (r == nullptr) {
            on_fetched(op, UCS_OK);
        } else if (UCS_PTR_IS_ERR(r)) {
            on_fetched(op, UCS_PTR_STATUS(r));
        }
    }
    if (copied.empty()) return;
    {
        std::lock_guard lock(conn->mu);
        auto& arrivals = conn->arrivals;
        for (auto& [seq, buffer] : copied) {
            // Arrivals hold consecutive seqs from the front's (unless a close cleared them).
            if (arrivals.empty() || seq < arrivals.front().seq) continue;
            const size_t i = seq - arrivals.front().seq;
            if (i >= arrivals.size()) continue;
            arrivals[i].message.payload = std::move(buffer);
            arrivals[i].state = Arrival::State::kReady;
            conn->stats.shared_received++;
        }
    }
    conn->changed.notify_all();
    send_control(conn, kAmSharedAck, encode_ack(copied_upto));
}

void UcxCore::on_fetch_done(void* request, ucs_status_t status, size_t, void* user_data) {
    auto* op = static_cast<FetchOp*>(user_data);
    op->core->on_fetched(op, status);
    ucp_request_free(request);
}

void UcxCore::on_fetched(FetchOp* op, ucs_status_t status) {
    std::unique_ptr<FetchOp> owned(op);
    UcxConn& conn = *op->conn;
    {
        std::lock_guard lock(conn.mu);
        for (auto& a : conn.arrivals) {
            if (a.seq != op->seq) continue;
            if (status == UCS_OK) {
                a.message.payload = std::move(op->buffer);
                a.state = Arrival::State::kReady;
            } else if (conn.error.ok()) {
                conn.error = Status(StatusCode::kUnavailable, "receiving from " + conn.peer + ": " +
                                                                  ucs_status_string(status));
            }
            break;
        }
    }
    conn.changed.notify_all();
    op->buffer = Buffer();  // not handed out: back to the pool before the release is announced
    op_done(conn);
}

}  // namespace deltaserve::transport
