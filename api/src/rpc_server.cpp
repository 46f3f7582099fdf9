#include "deltaserve/api/rpc_server.h"

#include <capnp/ez-rpc.h>
#include <kj/async.h>

#include <future>
#include <list>
#include <mutex>
#include <thread>

#include "deltaserve/api/cluster_nodes.h"
#include "deltaserve/api/rpc_convert.h"
#include "deltaserve/api/version.h"
#include "deltaserve/common/logging.h"
#include "deltaserve/transport/peer_auth.h"
#include "rpc_thread.h"

namespace deltaserve::api {

namespace {

// The gateway's TokenSink as the decode worker's TurnSink. The worker calls it from its own
// threads; every use of the capability happens on the RPC thread (kj objects are not
// thread-safe), through its executor, or directly when already there.
class RemoteSink final : public decode::TurnSink {
  public:
    // What lives on the RPC thread: the capability, and the gateway's wait() for the end.
    struct State {
        kj::Maybe<rpc::TokenSink::Client> sink;
        kj::Maybe<kj::Own<kj::PromiseFulfiller<void>>> waiting;
        bool delivered = false;  // the end reached the gateway
    };

    RemoteSink(const kj::Executor& executor, std::thread::id rpc_thread,
               rpc::TokenSink::Client sink)
        : executor_(executor.addRef()), rpc_thread_(rpc_thread), state_(std::make_shared<State>()) {
        state_->sink = kj::mv(sink);
    }
    ~RemoteSink() noexcept override = default;
    const std::shared_ptr<State>& state() const { return state_; }

    // The tokens ride with the next piece: the gateway knows a token once its text is on the
    // way, which is what it needs to continue the turn elsewhere.
    void on_token(int32_t token) override { tokens_.push_back(token); }
    bool on_piece(std::string_view piece) override {
        std::vector<int32_t> tokens = std::move(tokens_);
        tokens_.clear();
        return on_rpc_thread([&] {
            KJ_IF_MAYBE (s, state_->sink) {
                auto req = s->pieceRequest();
                req.setText(kj::StringPtr(std::string(piece).c_str()));
                auto ids = req.initTokens(static_cast<unsigned>(tokens.size()));
                for (size_t i = 0; i < tokens.size(); ++i)
                    ids.set(static_cast<unsigned>(i), tokens[i]);
                req.send().detach([](kj::Exception&&) {});  // a lost gateway cancels via wait()
            }
        });
    }
    void on_logprobs(const model::TokenLogprobs& lp) override {
        on_rpc_thread([&] {
            KJ_IF_MAYBE (s, state_->sink) {
                auto req = s->logprobsRequest();
                rpc::to_capnp(lp, req.initToken());
                req.send().detach([](kj::Exception&&) {});
            }
        });
    }
    void on_prompt_done() override {
        on_rpc_thread([&] {
            KJ_IF_MAYBE (s, state_->sink) {
                s->promptDoneRequest().send().detach([](kj::Exception&&) {});
            }
        });
    }
    void on_end(Result<decode::TurnEnd> end) override {
        on_rpc_thread([&] {
            KJ_IF_MAYBE (s, state_->sink) {
                auto req = s->endRequest();
                rpc::to_capnp(end, req.initEnd());
                auto state = state_;
                req.send()
                    .then([state](auto&&) { RemoteSink::delivered(*state); },
                          [state](kj::Exception&&) { RemoteSink::delivered(*state); })
                    .detach([](kj::Exception&&) {});
            }
            state_->sink = nullptr;  // the capability is dropped here, on its thread
        });
    }
    static void delivered(State& s) {
        s.delivered = true;
        KJ_IF_MAYBE (f, s.waiting) {
            (*f)->fulfill();
        }
        s.waiting = nullptr;
    }

  private:
    template <typename F>
    bool on_rpc_thread(F&& f) {
        if (std::this_thread::get_id() == rpc_thread_) {
            f();
            return true;
        }
        try {
            execute_sync(*executor_, f);
            return true;
        } catch (const kj::Exception&) {
            return false;  // the RPC thread stopped: the turn ends
        }
    }
    kj::Own<const kj::Executor> executor_;
    std::thread::id rpc_thread_;
    std::shared_ptr<State> state_;
    std::vector<int32_t> tokens_;  // since the last piece (the worker's calls never overlap)
};

class TurnImpl final : public rpc::Turn::Server {
  public:
    TurnImpl(decode::DecodeWorker& w, uint64_t id, std::shared_ptr<RemoteSink::State> state)
        : w_(w), id_(id), state_(std::move(state)) {}
    // The gateway let go of a turn that has not ended (its connection was lost, or it
    // stopped): nobody is left to read it, so it ends now and frees its session.
    ~TurnImpl() noexcept {
        if (!state_->delivered) w_.cancel(id_, Status());
    }
    kj::Promise<void> wait(WaitContext context) override {
        if (state_->delivered) return kj::READY_NOW;
        // A lost gateway cancels the call (Cap'n Proto 0.9 lets a call run on otherwise),
        // which lets go of this turn.
        context.allowCancellation();
        auto paf = kj::newPromiseAndFulfiller<void>();
        state_->waiting = kj::mv(paf.fulfiller);
        return kj::mv(paf.promise);
    }
    kj::Promise<void> cancel(CancelContext context) override {
        auto p = context.getParams();
        w_.cancel(id_, p.hasError() ? rpc::from_capnp(p.getError()) : Status());
        return kj::READY_NOW;
    }

  private:
    decode::DecodeWorker& w_;
    uint64_t id_;
    std::shared_ptr<RemoteSink::State> state_;
};

class DecodeNodeImpl final : public rpc::DecodeNode::Server {
  public:
    DecodeNodeImpl(decode::DecodeWorker& w, std::string address)
        : w_(w), address_(std::move(address)) {}
    kj::Promise<void> startTurn(StartTurnContext context) override {
        auto p = context.getParams();
        auto sink = std::make_shared<RemoteSink>(kj::getCurrentThreadExecutor(),
                                                 std::this_thread::get_id(), p.getSink());
        decode::TurnSpec spec = rpc::from_capnp(p.getSpec());
        const uint64_t id = spec.turn_id;
        auto plan = w_.start_turn(std::move(spec), sink);
        auto r = context.getResults();
        if (!plan.ok()) {
            rpc::to_capnp(plan.status(), r.initError());
            return kj::READY_NOW;
        }
        auto b = r.initPlan();
        b.setCachedTokens(plan->cached_tokens);
        b.setRemotePrefill(plan->remote_prefill);
        b.setPullTokens(plan->pull_tokens);
        r.setTurn(kj::heap<TurnImpl>(w_, id, sink->state()));
        return kj::READY_NOW;
    }
    kj::Promise<void> dataAddress(DataAddressContext context) override {
        context.getResults().setAddress(address_);
        return kj::READY_NOW;
    }
    kj::Promise<void> stats(StatsContext context) override {
        rpc::to_capnp(w_.stats(), context.getResults().initStats());
        return kj::READY_NOW;
    }

    kj::Promise<void> dropSession(DropSessionContext context) override {
        w_.drop_session(context.getParams().getSessionId());
        return kj::READY_NOW;
    }
    kj::Promise<void> evictSession(EvictSessionContext context) override {
        const Status s = w_.evict_session(context.getParams().getSessionId().cStr());
        if (!s.ok()) rpc::to_capnp(s, context.getResults().initError());
        return kj::READY_NOW;
    }
    kj::Promise<void> pinSession(PinSessionContext context) override {
        const auto p = context.getParams();
        const Status s =
            w_.pin_session(p.getSessionId().cStr(), p.getPinned(), p.getScope().cStr());
        if (!s.ok()) rpc::to_capnp(s, context.getResults().initError());
        return kj::READY_NOW;
    }
    kj::Promise<void> checkpoint(CheckpointContext context) override {
        auto r = context.getResults();
        auto path = w_.checkpoint(context.getParams().getName().cStr());
        if (path.ok()) {
            r.setPath(*path);
        } else {
            rpc::to_capnp(path.status(), r.initError());
        }
        return kj::READY_NOW;
    }
    kj::Promise<void> sessionBlocks(SessionBlocksContext context) override {
        auto r = context.getResults();
        auto b = w_.session_blocks(context.getParams().getSessionId().cStr());
        if (b.ok()) {
            rpc::to_capnp(*b, r.initBlocks());
        } else {
            rpc::to_capnp(b.status(), r.initError());
        }
        return kj::READY_NOW;
    }
    kj::Promise<void> readBlock(ReadBlockContext context) override {
        const auto p = context.getParams();
        auto r = context.getResults();
        auto b = w_.read_block(p.getKey(), p.getLimit());
        if (b.ok()) {
            r.setBytes(kj::arrayPtr(reinterpret_cast<const kj::byte*>(b->data()), b->size()));
        } else {
            rpc::to_capnp(b.status(), r.initError());
        }
        return kj::READY_NOW;
    }
    kj::Promise<void> sessionKv(SessionKvContext context) override {
        const auto ids = context.getParams().getIds();
        auto r = context.getResults();
        if (ids.size() > kMaxSessionKvIds) {
            rpc::to_capnp(invalid_argument("sessionKv: more than " +
                                           std::to_string(kMaxSessionKvIds) + " ids"),
                          r.initError());
            return kj::READY_NOW;
        }
        std::vector<std::string> v;
        for (auto id : ids) v.emplace_back(id.cStr());
        const auto kv = w_.session_kv(v);
        auto list = r.initSessions(static_cast<unsigned>(kv.size()));
        for (unsigned i = 0; i < kv.size(); ++i) rpc::to_capnp(kv[i], list[i]);
        return kj::READY_NOW;
    }

  private:
    decode::DecodeWorker& w_;
    std::string address_;
};

// Runs prefills off the RPC thread and joins them when the server stops.
class PrefillNodeImpl final : public rpc::PrefillNode::Server {
  public:
    PrefillNodeImpl(prefill::PrefillWorker& w, RpcThread& rpc) : w_(w), rpc_(rpc) {}
    kj::Promise<void> prefill(PrefillContext context) override {
        auto p = context.getParams().getRequest();
        prefill::PrefillRequest req;
        req.turn = rpc::from_capnp(p.getTurn());
        req.decode_address = p.getDecodeAddress();
        req.pull_tokens = p.getPullTokens();
        auto out = std::make_shared<Result<prefill::PrefillResult>>(unavailable("not run"));
        auto paf = kj::newPromiseAndCrossThreadFulfiller<void>();
        auto done = std::make_shared<NoexceptHolder<kj::CrossThreadPromiseFulfiller<void>>>(
            kj::mv(paf.fulfiller));
        if (!rpc_.spawn([this, req = std::move(req), out, done] {
                *out = w_.prefill(req);
                handoff_release(out.get());
                done->own->fulfill();
            })) {
            rpc::to_capnp(resource_exhausted("the prefill node is busy; try again"),
                          context.getResults().initError());
            return kj::READY_NOW;
        }
        return paf.promise.then([context, out]() mutable {
            handoff_acquire(out.get());
            auto r = context.getResults();
            if (!out->ok()) return rpc::to_capnp(out->status(), r.initError());
            rpc::to_capnp(**out, r.initResult());
        });
    }
    kj::Promise<void> stats(StatsContext context) override {
        rpc::to_capnp(w_.stats(), context.getResults().initStats());
        return kj::READY_NOW;
    }
    kj::Promise<void> cancel(CancelContext context) override {
        w_.cancel(context.getParams().getTurn());
        return kj::READY_NOW;
    }

  private:
    prefill::PrefillWorker& w_;
    RpcThread& rpc_;
};

class NodeImpl final : public rpc::Node::Server {
  public:
    NodeImpl(const NodeRoles& roles, RpcThread& rpc) : roles_(roles), rpc_(rpc) {}
    kj::Promise<void> info(InfoContext context) override {
        auto r = context.getResults();
        r.setRole(roles_.decode && roles_.prefill ? "decode+prefill"
                  : roles_.decode                 ? "decode"
                                                  : "prefill");
        r.setName(roles_.name);
        r.setModelId(roles_.model_id);
        r.setVersion(deltaserve_version());
        return kj::READY_NOW;
    }
    kj::Promise<void> decode(DecodeContext context) override {
        KJ_REQUIRE(roles_.decode != nullptr, "this node does not decode");
        context.getResults().setNode(kj::heap<DecodeNodeImpl>(*roles_.decode, roles_.data_address));
        return kj::READY_NOW;
    }
    kj::Promise<void> prefill(PrefillContext context) override {
        KJ_REQUIRE(roles_.prefill != nullptr, "this node does not prefill");
        context.getResults().setNode(kj::heap<PrefillNodeImpl>(*roles_.prefill, rpc_));
        return kj::READY_NOW;
    }

  private:
    NodeRoles roles_;
    RpcThread& rpc_;
};

// One caller's way in: its nonce, good for one proof.
class GateImpl final : public rpc::Gate::Server {
  public:
    GateImpl(const NodeRoles& roles, RpcThread& rpc, const std::string& secret, std::string nonce)
        : roles_(roles), rpc_(rpc), secret_(secret), nonce_(std::move(nonce)) {}
    kj::Promise<void> open(OpenContext context) override {
        const bool fresh = !std::exchange(spent_, true);
        if (!fresh ||
            !transport::verify(secret_, "rpc", nonce_, context.getParams().getProof().cStr())) {
            spdlog::warn("node {}: refused an RPC caller that did not prove the cluster token",
                         roles_.name);
            KJ_FAIL_REQUIRE("the node refused the cluster token (cluster_token differs)");
        }
        context.getResults().setNode(kj::heap<NodeImpl>(roles_, rpc_));
        return kj::READY_NOW;
    }

  private:
    const NodeRoles& roles_;
    RpcThread& rpc_;
    const std::string& secret_;
    const std::string nonce_;
    bool spent_ = false;
};

class NodeDoorImpl final : public rpc::NodeDoor::Server {
  public:
    NodeDoorImpl(const NodeRoles& roles, RpcThread& rpc, const std::string& secret)
        : roles_(roles), rpc_(rpc), secret_(secret) {}
    kj::Promise<void> challenge(ChallengeContext context) override {
        std::string nonce = transport::make_nonce();
        auto r = context.getResults();
        r.setNonce(nonce);
        r.setGate(kj::heap<GateImpl>(roles_, rpc_, secret_, std::move(nonce)));
        return kj::READY_NOW;
    }

  private:
    const NodeRoles& roles_;
    RpcThread& rpc_;
    const std::string& secret_;
};

class RpcServerImpl final : public RpcServer {
  public:
    RpcServerImpl(NodeRoles roles, std::string secret)
        : roles_(std::move(roles)), secret_(std::move(secret)) {}
    Status start(const std::string& address) {
        return rpc_.start(address, [this]() -> capnp::Capability::Client {
            return kj::heap<NodeDoorImpl>(roles_, rpc_, secret_);
        });
    }
    uint16_t port() const override { return rpc_.port(); }

  private:
    const NodeRoles roles_;
    const std::string secret_;
    RpcThread rpc_;
};

}  // namespace

Result<std::unique_ptr<RpcServer>> RpcServer::start(const std::string& address, NodeRoles roles,
                                                    const std::string& cluster_token) {
    auto s = std::make_unique<RpcServerImpl>(std::move(roles), cluster_token);
    DS_RETURN_IF_ERROR(s->start(address));
    return std::unique_ptr<RpcServer>(std::move(s));
}

}  // namespace deltaserve::api
