#include "deltaserve/api/rpc_client.h"

#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>

#include <future>
#include <map>
#include <thread>

#include "deltaserve/api/rpc_convert.h"
#include "deltaserve/transport/peer_auth.h"
#include "kj_handoff.h"

namespace deltaserve::api {

namespace {

constexpr auto kCallTimeout = 30 * kj::SECONDS;
constexpr auto kPrefillTimeout = 600 * kj::SECONDS;

// A turn's sink on the gateway's side, on the RPC thread: the decode node's pieces and end
// go to the engine's TurnSink; a lost node ends the turn with kUnavailable.
struct Bridge {
    std::shared_ptr<decode::TurnSink> sink;
    std::string peer;
    bool ended = false;
    void end(Result<decode::TurnEnd> e) {
        if (ended) return;
        ended = true;
        sink->on_end(std::move(e));
    }
};

class SinkImpl final : public rpc::TokenSink::Server {
  public:
    explicit SinkImpl(std::shared_ptr<Bridge> b) : b_(std::move(b)) {}
    kj::Promise<void> piece(PieceContext context) override {
        if (b_->ended) return kj::READY_NOW;
        for (int32_t t : context.getParams().getTokens()) b_->sink->on_token(t);
        b_->sink->on_piece(context.getParams().getText().cStr());
        return kj::READY_NOW;
    }
    kj::Promise<void> logprobs(LogprobsContext context) override {
        if (!b_->ended) b_->sink->on_logprobs(rpc::from_capnp(context.getParams().getToken()));
        return kj::READY_NOW;
    }
    kj::Promise<void> promptDone(PromptDoneContext) override {
        if (!b_->ended) b_->sink->on_prompt_done();
        return kj::READY_NOW;
    }
    kj::Promise<void> end(EndContext context) override {
        b_->end(rpc::from_capnp(context.getParams().getEnd()));
        return kj::READY_NOW;
    }

  private:
    std::shared_ptr<Bridge> b_;
};

class RpcClientImpl;

class RemoteDecode final : public DecodeNode {
  public:
    RemoteDecode(RpcClientImpl& c, std::string name, std::string address)
        : c_(c), name_(std::move(name)), address_(std::move(address)) {}
    std::string name() const override { return name_; }
    Result<decode::TurnPlan> start_turn(decode::TurnSpec spec,
                                        std::shared_ptr<decode::TurnSink> sink) override;
    void cancel(uint64_t turn_id, Status why) override;
    Result<decode::DecodeStats> stats() override;
    void drop_session(const std::string& id) override;
    Result<std::vector<decode::SessionKv>> session_kv(const std::vector<std::string>& ids) override;
    Result<std::string> checkpoint(const std::string& name) override;
    Status evict_session(const std::string& id) override;
    Status pin_session(const std::string& id, bool pinned, const std::string& scope) override;
    Result<decode::SessionBlocks> session_blocks(const std::string& id) override;
    Result<std::string> read_block(uint64_t key, uint64_t limit) override;
    std::string data_address() const override { return address_; }
    std::string rpc_address() const override;
    std::string version() const override;

  private:
    RpcClientImpl& c_;
    std::string name_, address_;
};

class RemotePrefill final : public PrefillNode {
  public:
    RemotePrefill(RpcClientImpl& c, std::string name) : c_(c), name_(std::move(name)) {}
    std::string name() const override { return name_; }
    Result<prefill::PrefillResult> prefill(const prefill::PrefillRequest& request) override;
    void cancel(uint64_t turn_id) override;
    Result<prefill::PrefillStats> stats() override;
    std::string rpc_address() const override;
    std::string version() const override;

  private:
    RpcClientImpl& c_;
    std::string name_;
};

class RpcClientImpl final : public RpcClient, public kj::TaskSet::ErrorHandler {
  public:
    RpcClientImpl(std::string address, std::string secret)
        : address_(std::move(address)), secret_(std::move(secret)) {}
    ~RpcClientImpl() noexcept override {
        if (executor_) {
            try {
                execute_sync(*executor_, [this] {
                    turns_.clear();
                    conn_ = nullptr;
                    waiting_.clear();  // their calls end: the client is going away
                    tasks_ = nullptr;
                    stop_->fulfill();
                });
            } catch (const kj::Exception&) {
            }
        }
        if (thread_.joinable()) thread_.join();
    }

    Status start(std::chrono::milliseconds wait) {
        std::promise<void> started;
        auto ready = started.get_future();
        thread_ = std::thread([this, &started] {
            auto io = kj::setupAsyncIo();
            io_ = &io;
            tasks_ = kj::heap<kj::TaskSet>(*this);
            auto paf = kj::newPromiseAndFulfiller<void>();
            stop_ = kj::mv(paf.fulfiller);
            executor_ = kj::getCurrentThreadExecutor().addRef();
            started.set_value();
            paf.promise.wait(io.waitScope);
            stop_ = nullptr;
            io_ = nullptr;
        });
        ready.wait();
        const auto until = std::chrono::steady_clock::now() + wait;
        Status last;
        do {
            last = call<Status>([this]() -> kj::Promise<Status> {
                return node().infoRequest().send().then([this](auto&& r) {
                    info_.role = r.getRole();
                    info_.name = r.getName();
                    info_.model_id = r.getModelId();
                    info_.version = r.getVersion();
                    return Status();
                });
            });
            if (last.ok()) return last;
            if (last.message().find("refused the cluster token") != std::string::npos) {
                return unauthenticated(last.message());  // waiting will not change it
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        } while (std::chrono::steady_clock::now() < until);
        return last;
    }

    const NodeInfo& info() const override { return info_; }

    Result<DecodeNode*> decode_node() override {
        if (info_.role.find("decode") == std::string::npos) {
            return failed_precondition("node " + info_.name + " at " + address_ +
                                       " does not decode");
        }
        if (!decode_) {
            auto address = call<Result<std::string>>([this]() -> kj::Promise<Result<std::string>> {
                return decode_cap().dataAddressRequest().send().then([](auto&& r) {
                    return Result<std::string>(std::string(r.getAddress().cStr()));
                });
            });
            DS_RETURN_IF_ERROR(address.status());
            decode_ = std::make_unique<RemoteDecode>(*this, info_.name, *address);
        }
        return decode_.get();
    }
    Result<PrefillNode*> prefill_node() override {
        if (info_.role.find("prefill") == std::string::npos) {
            return failed_precondition("node " + info_.name + " at " + address_ +
                                       " does not prefill");
        }
        if (!prefill_) prefill_ = std::make_unique<RemotePrefill>(*this, info_.name);
        return prefill_.get();
    }

    // Runs f on the RPC thread (connecting first when needed) and waits for its promise; a
    // Cap'n Proto failure (the node is gone) becomes kUnavailable. T is a Status or Result.
    template <typename T, typename F>
    T call(F&& f, kj::Duration timeout = kCallTimeout) {
        uint64_t used = 0;  // the connection the call went over (0: none)
        try {
            return execute_sync(*executor_, [&]() -> kj::Promise<T> {
                return io_->provider->getTimer().timeoutAfter(timeout, ensure().then([&]() {
                    used = generation_;
                    return f();
                }));
            });
        } catch (const kj::Exception& e) {
            // A lost connection, or a call with no answer in time (a peer that went silent),
            // is dropped and made again by the next call; a newer connection, made since by
            // another call, is left alone. Any other error leaves the connection, and the
            // turns running over it, alone.
            const auto type = e.getType();
            if (used != 0 && (type == kj::Exception::Type::DISCONNECTED ||
                              type == kj::Exception::Type::OVERLOADED)) {
                execute_sync(*executor_, [this, used] {
                    if (generation_ == used) conn_ = nullptr;
                });
            }
            return rpc::from_exception(e, label());
        }
    }

    // On the RPC thread.
    rpc::Node::Client& node() { return (*conn_).node; }
    rpc::DecodeNode::Client decode_cap() { return node().decodeRequest().send().getNode(); }
    rpc::PrefillNode::Client prefill_cap() { return node().prefillRequest().send().getNode(); }
    kj::TaskSet& tasks() { return *tasks_; }
    std::map<uint64_t, rpc::Turn::Client>& turns() { return turns_; }
    const std::string& address() const { return address_; }
    // How errors name the node: "prefill node p0 at 127.0.0.1:7101".
    std::string label() const {
        return (info_.name.empty() ? "node" : info_.role + " node " + info_.name) + " at " +
               address_;
    }

  private:
    struct Conn {
        kj::Own<kj::AsyncIoStream> stream;
        kj::Own<capnp::TwoPartyClient> client;
        rpc::Node::Client node;
    };
    // Resolves once there is a connection. Calls that find none while one is being made wait
    // for it: a second connection made at the same time would replace the first and break
    // every call and turn already on it.
    kj::Promise<void> ensure() {
        if (conn_.get() != nullptr) return kj::READY_NOW;
        auto paf = kj::newPromiseAndFulfiller<void>();
        waiting_.add(kj::mv(paf.fulfiller));
        if (!connecting_) {
            connecting_ = true;
            tasks_->add(connect().then([this] { settle(nullptr); },
                                       [this](kj::Exception&& e) { settle(&e); }));
        }
        return kj::mv(paf.promise);
    }
    void settle(const kj::Exception* failed) {
        connecting_ = false;
        auto waiting = kj::mv(waiting_);
        waiting_ = kj::Vector<kj::Own<kj::PromiseFulfiller<void>>>();
        for (auto& w : waiting) {
            if (failed != nullptr) {
                w->reject(kj::cp(*failed));
            } else {
                w->fulfill();
            }
        }
    }
    kj::Promise<void> connect() {
        return io_->provider->getNetwork()
            .parseAddress(address_.c_str())
            .then([](kj::Own<kj::NetworkAddress>&& a) { return a->connect(); })
            .then([this](kj::Own<kj::AsyncIoStream>&& stream) {
                auto client = kj::heap<capnp::TwoPartyClient>(*stream);
                auto door = client->bootstrap().castAs<rpc::NodeDoor>();
                auto challenge = door.challengeRequest().send();
                return challenge
                    .then([this](auto&& r) {
                        auto open = r.getGate().openRequest();
                        open.setProof(transport::prove(secret_, "rpc", r.getNonce().cStr()));
                        return open.send();
                    })
                    .then([this, stream = kj::mv(stream),
                           client = kj::mv(client)](auto&& opened) mutable {
                        connected(kj::mv(stream), kj::mv(client), opened.getNode());
                    });
            });
    }
    void connected(kj::Own<kj::AsyncIoStream> stream, kj::Own<capnp::TwoPartyClient> client,
                   rpc::Node::Client node) {
        conn_ = kj::heap<Conn>(Conn{kj::mv(stream), kj::mv(client), kj::mv(node)});
        ++generation_;
        // A lost connection is dropped (the next call reconnects); the turns on it end
        // through their failing wait() calls.
        tasks_->add(conn_->client->onDisconnect().then([this, mine = generation_] {
            if (generation_ == mine) conn_ = nullptr;
        }));
    }

  public:
    void taskFailed(kj::Exception&&) override {}

  private:
    std::string address_;
    const std::string secret_;
    NodeInfo info_;
    std::thread thread_;
    kj::AsyncIoContext* io_ = nullptr;
    kj::Own<const kj::Executor> executor_;
    kj::Own<kj::PromiseFulfiller<void>> stop_;
    kj::Own<kj::TaskSet> tasks_;
    kj::Own<Conn> conn_;
    uint64_t generation_ = 0;  // counts connections made; names conn_
    bool connecting_ = false;  // a connection is being made; calls wait in waiting_
    kj::Vector<kj::Own<kj::PromiseFulfiller<void>>> waiting_;
    std::map<uint64_t, rpc::Turn::Client> turns_;
    std::unique_ptr<RemoteDecode> decode_;
    std::unique_ptr<RemotePrefill> prefill_;
};

Result<decode::TurnPlan> RemoteDecode::start_turn(decode::TurnSpec spec,
                                                  std::shared_ptr<decode::TurnSink> sink) {
    auto bridge = std::make_shared<Bridge>();
    bridge->sink = std::move(sink);
    bridge->peer = c_.label();
    return c_.call<Result<decode::TurnPlan>>([&]() -> kj::Promise<Result<decode::TurnPlan>> {
        auto req = c_.decode_cap().startTurnRequest();
        rpc::to_capnp(spec, req.initSpec());
        req.setSink(kj::heap<SinkImpl>(bridge));
        const uint64_t id = spec.turn_id;
        return req.send().then([this, bridge, id](auto&& r) -> Result<decode::TurnPlan> {
            if (r.hasError()) return rpc::from_capnp(r.getError());
            decode::TurnPlan plan;
            plan.cached_tokens = r.getPlan().getCachedTokens();
            plan.remote_prefill = r.getPlan().getRemotePrefill();
            plan.pull_tokens = r.getPlan().getPullTokens();
            rpc::Turn::Client turn = r.getTurn();
            c_.turns().emplace(id, turn);
            c_.tasks().add(turn.waitRequest().send().then(
                [this, id](auto&&) { c_.turns().erase(id); },
                [this, bridge, id](kj::Exception&& e) {
                    c_.turns().erase(id);
                    bridge->end(rpc::from_exception(e, bridge->peer));
                }));
            return plan;
        });
    });
}

void RemoteDecode::cancel(uint64_t turn_id, Status why) {
    (void)c_.call<Status>([&]() -> kj::Promise<Status> {
        auto it = c_.turns().find(turn_id);
        if (it == c_.turns().end()) return Status();
        auto req = it->second.cancelRequest();
        if (!why.ok()) rpc::to_capnp(why, req.initError());
        return req.send().then([](auto&&) { return Status(); });
    });
}

void RemoteDecode::drop_session(const std::string& id) {
    (void)c_.call<Status>([&]() -> kj::Promise<Status> {
        auto req = c_.decode_cap().dropSessionRequest();
        req.setSessionId(id);
        return req.send().then([](auto&&) { return Status(); });
    });
}

Result<std::vector<decode::SessionKv>> RemoteDecode::session_kv(
    const std::vector<std::string>& ids) {
    using Out = Result<std::vector<decode::SessionKv>>;
    if (ids.size() > kMaxSessionKvIds) return invalid_argument("too many session ids");
    return c_.call<Out>([&]() -> kj::Promise<Out> {
        auto req = c_.decode_cap().sessionKvRequest();
        auto list = req.initIds(static_cast<unsigned>(ids.size()));
        for (unsigned i = 0; i < ids.size(); ++i) list.set(i, ids[i]);
        return req.send().then([](auto&& r) -> Out {
            if (r.hasError()) return rpc::from_capnp(r.getError());
            std::vector<decode::SessionKv> out;
            for (auto k : r.getSessions()) out.push_back(rpc::from_capnp(k));
            return out;
        });
    });
}

Result<decode::SessionBlocks> RemoteDecode::session_blocks(const std::string& id) {
    using Out = Result<decode::SessionBlocks>;
    return c_.call<Out>([&]() -> kj::Promise<Out> {
        auto req = c_.decode_cap().sessionBlocksRequest();
        req.setSessionId(id);
        return req.send().then([](auto&& r) -> Out {
            if (r.hasError()) return rpc::from_capnp(r.getError());
            return rpc::from_capnp(r.getBlocks());
        });
    });
}

Result<std::string> RemoteDecode::read_block(uint64_t key, uint64_t limit) {
    using Out = Result<std::string>;
    return c_.call<Out>([&]() -> kj::Promise<Out> {
        auto req = c_.decode_cap().readBlockRequest();
        req.setKey(key);
        req.setLimit(limit);
        return req.send().then([](auto&& r) -> Out {
            if (r.hasError()) return rpc::from_capnp(r.getError());
            const auto b = r.getBytes();
            return std::string(reinterpret_cast<const char*>(b.begin()), b.size());
        });
    });
}

Result<std::string> RemoteDecode::checkpoint(const std::string& name) {
    return c_.call<Result<std::string>>([&]() -> kj::Promise<Result<std::string>> {
        auto req = c_.decode_cap().checkpointRequest();
        req.setName(name);
        return req.send().then([](auto&& r) -> Result<std::string> {
            if (r.hasError()) return rpc::from_capnp(r.getError());
            return std::string(r.getPath().cStr());
        });
    });
}

Status RemoteDecode::evict_session(const std::string& id) {
    return c_.call<Status>([&]() -> kj::Promise<Status> {
        auto req = c_.decode_cap().evictSessionRequest();
        req.setSessionId(id);
        return req.send().then([](auto&& r) -> Status {
            return r.hasError() ? rpc::from_capnp(r.getError()) : Status();
        });
    });
}

Status RemoteDecode::pin_session(const std::string& id, bool pinned, const std::string& scope) {
    return c_.call<Status>([&]() -> kj::Promise<Status> {
        auto req = c_.decode_cap().pinSessionRequest();
        req.setSessionId(id);
        req.setPinned(pinned);
        req.setScope(scope);
        return req.send().then([](auto&& r) -> Status {
            return r.hasError() ? rpc::from_capnp(r.getError()) : Status();
        });
    });
}

std::string RemoteDecode::rpc_address() const { return c_.address(); }
std::string RemoteDecode::version() const { return c_.info().version; }
std::string RemotePrefill::rpc_address() const { return c_.address(); }
std::string RemotePrefill::version() const { return c_.info().version; }

Result<decode::DecodeStats> RemoteDecode::stats() {
    return c_.call<Result<decode::DecodeStats>>([&]() -> kj::Promise<Result<decode::DecodeStats>> {
        return c_.decode_cap().statsRequest().send().then(
            [](auto&& r) { return Result<decode::DecodeStats>(rpc::from_capnp(r.getStats())); });
    });
}

Result<prefill::PrefillResult> RemotePrefill::prefill(const prefill::PrefillRequest& request) {
    return c_.call<Result<prefill::PrefillResult>>(
        [&]() -> kj::Promise<Result<prefill::PrefillResult>> {
            auto req = c_.prefill_cap().prefillRequest();
            auto b = req.initRequest();
            rpc::to_capnp(request.turn, b.initTurn());
            b.setDecodeAddress(request.decode_address);
            b.setPullTokens(request.pull_tokens);
            return req.send().then([](auto&& r) -> Result<prefill::PrefillResult> {
                if (r.hasError()) return rpc::from_capnp(r.getError());
                return rpc::from_capnp(r.getResult());
            });
        },
        kPrefillTimeout);
}

void RemotePrefill::cancel(uint64_t turn_id) {
    (void)c_.call<Status>([&]() -> kj::Promise<Status> {
        auto req = c_.prefill_cap().cancelRequest();
        req.setTurn(turn_id);
        return req.send().then([](auto&&) { return Status(); });
    });
}

Result<prefill::PrefillStats> RemotePrefill::stats() {
    return c_.call<Result<prefill::PrefillStats>>(
        [&]() -> kj::Promise<Result<prefill::PrefillStats>> {
            return c_.prefill_cap().statsRequest().send().then([](auto&& r) {
                return Result<prefill::PrefillStats>(rpc::from_capnp(r.getStats()));
            });
        });
}

}  // namespace

Result<std::unique_ptr<RpcClient>> RpcClient::connect(const std::string& address,
                                                      std::chrono::milliseconds wait,
                                                      const std::string& cluster_token) {
    auto c = std::make_unique<RpcClientImpl>(address, cluster_token);
    DS_RETURN_IF_ERROR(c->start(wait));
    return std::unique_ptr<RpcClient>(std::move(c));
}

}  // namespace deltaserve::api
