#include "deltaserve/api/chat_rpc_server.h"

#include <atomic>
#include <random>

#include "chat.capnp.h"
#include "rpc_convert.h"
#include "rpc_thread.h"

namespace deltaserve::api {

namespace {

std::string random_session_id() {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    char buf[24];
    std::snprintf(buf, sizeof buf, "rpc-%016llx", static_cast<unsigned long long>(rng()));
    return buf;
}

// One send's state, shared by the RPC thread and the thread running the turn.
struct SendState {
    std::atomic<bool> cancelled{false};
    kj::Vector<kj::Promise<void>>
        pieces;  // RPC thread only: every piece sent, to join before returning
    Result<TurnResult> out{unavailable("the turn did not run")};
    ~SendState() noexcept = default;
};

class ChatSessionImpl final : public rpc::ChatSession::Server {
  public:
    ChatSessionImpl(ChatEngine& engine, RpcThread& rpc, const ChatRpcOptions& options,
                    std::string id)
        : engine_(engine), rpc_(rpc), options_(options), id_(std::move(id)) {}

    kj::Promise<void> send(SendContext context) override {
        auto p = context.getParams();
        auto results = context.getResults();
        if (running_ && !running_->cancelled.load()) {
            rpc::to_capnp(failed_precondition("session " + id_ + " has a send running"),
                          results.initError());
            return kj::READY_NOW;
        }
        ChatRequest req;
        req.session_id = id_;
        for (auto m : p.getMessages()) {
            const std::string role = m.getRole();
            if (role != "system" && role != "user" && role != "assistant" && role != "developer") {
                rpc::to_capnp(invalid_argument("messages: unknown role '" + role + "'"),
                              results.initError());
                return kj::READY_NOW;
            }
            req.messages.push_back({role == "developer" ? "system" : role, m.getContent()});
        }
        if (req.messages.empty()) {
            rpc::to_capnp(invalid_argument("messages: none given"), results.initError());
            return kj::READY_NOW;
        }
        auto o = p.getOptions();
        if (o.hasSampling()) {
            auto s = o.getSampling();
            req.sampling.temperature = s.getTemperature();
            req.sampling.top_k = s.getTopK();
            req.sampling.top_p = s.getTopP() > 0 ? s.getTopP() : options_.sampling.top_p;
            req.sampling.min_p = s.getMinP();
            req.sampling.repeat_penalty = s.getRepeatPenalty() > 0 ? s.getRepeatPenalty() : 1.0f;
            req.sampling.repeat_last_n = s.getRepeatLastN();
            req.sampling.seed = s.getSeed();
        } else {
            req.sampling = options_.sampling;
        }
        if (!o.getSeedGiven()) req.sampling.seed = std::random_device{}();
        req.max_tokens = o.getMaxTokens() >= 0 ? o.getMaxTokens() : options_.default_max_tokens;
        for (auto s : o.getStop()) {
            if (s.size() == 0) {
                rpc::to_capnp(invalid_argument("stop: an empty string"), results.initError());
                return kj::READY_NOW;
            }
            req.stop.emplace_back(s.cStr());
        }
        auto state = std::make_shared<SendState>();
        running_ = state;
        rpc::TokenSink::Client sink = p.getSink();
        auto paf = kj::newPromiseAndCrossThreadFulfiller<void>();
        auto done = std::make_shared<NoexceptHolder<kj::CrossThreadPromiseFulfiller<void>>>(
            kj::mv(paf.fulfiller));
        auto sink_holder = std::make_shared<NoexceptHolder<rpc::TokenSink::Client>>(
            kj::heap<rpc::TokenSink::Client>(kj::mv(sink)));
        ChatEngine& engine = engine_;
        RpcThread& rpc = rpc_;
        rpc_.spawn([&engine, &rpc, req = std::move(req), state, done, sink_holder] {
            state->out = engine.run_turn(req, [&](std::string_view piece) {
                if (state->cancelled) return false;
                try {
                    rpc.executor().executeSync([&] {
                        auto r = sink_holder->own->pieceRequest();
                        r.setText(std::string(piece));
                        state->pieces.add(r.send().ignoreResult().catch_([state](kj::Exception&&) {
                            state->cancelled = true;  // the client is gone
                        }));
                    });
                } catch (const kj::Exception&) {
                    state->cancelled = true;
                }
                return !state->cancelled.load();
            });
            try {  // the capability goes on the RPC thread, where it lives
                rpc.executor().executeSync([&] { sink_holder->own = nullptr; });
            } catch (const kj::Exception&) {
            }
            done->own->fulfill();
        });
        return paf.promise
            .then([state]() { return kj::joinPromises(state->pieces.releaseAsArray()); })
            .then([this, state, context]() mutable {
                if (running_ == state) running_.reset();
                auto r = context.getResults();
                if (!state->out.ok()) return rpc::to_capnp(state->out.status(), r.initError());
                r.setFinishReason(state->cancelled ? "cancelled" : state->out->finish_reason);
                r.setText(state->out->text);
                auto u = r.initUsage();
                u.setPromptTokens(state->out->usage.prompt_tokens);
                u.setCompletionTokens(state->out->usage.completion_tokens);
                u.setCachedTokens(state->out->usage.cached_tokens);
            });
    }
    kj::Promise<void> cancel(CancelContext) override {
        if (running_) running_->cancelled = true;
        return kj::READY_NOW;
    }
    kj::Promise<void> close(CloseContext) override {
        if (running_) running_->cancelled = true;
        engine_.forget_session(id_);
        return kj::READY_NOW;
    }
    kj::Promise<void> info(InfoContext context) override {
        auto r = context.getResults();
        r.setId(id_);
        for (const SessionSummary& s : engine_.sessions()) {
            if (s.id == id_) r.setMessages(s.messages);
        }
        return kj::READY_NOW;
    }

  private:
    ChatEngine& engine_;
    RpcThread& rpc_;
    const ChatRpcOptions& options_;
    std::string id_;
    std::shared_ptr<SendState> running_;
};

class ChatServiceImpl final : public rpc::ChatService::Server {
  public:
    ChatServiceImpl(ChatEngine& engine, RpcThread& rpc, const ChatRpcOptions& options)
        : engine_(engine), rpc_(rpc), options_(options) {}
    kj::Promise<void> open(OpenContext context) override {
        std::string id = context.getParams().getSessionId();
        if (id.empty()) id = random_session_id();
        context.getResults().setSession(kj::heap<ChatSessionImpl>(engine_, rpc_, options_, id));
        return kj::READY_NOW;
    }
    kj::Promise<void> models(ModelsContext context) override {
        context.getResults().initIds(1).set(0, engine_.model_id());
        return kj::READY_NOW;
    }

  private:
    ChatEngine& engine_;
    RpcThread& rpc_;
    const ChatRpcOptions& options_;
};

class AdminImpl final : public rpc::Admin::Server {
  public:
    explicit AdminImpl(ChatEngine& engine) : engine_(engine) {}
    kj::Promise<void> stats(StatsContext context) override {
        const EngineStats s = engine_.stats();
        auto r = context.getResults();
        r.setSessions(s.sessions);
        r.setQueued(s.queued);
        r.setKvBytes(s.kv_bytes);
        r.setKeepRatio(s.keep_ratio);
        r.setKvBytesShipped(s.kv_bytes_shipped);
        r.setPrefillRetries(s.prefill_retries);
        return kj::READY_NOW;
    }
    kj::Promise<void> sessions(SessionsContext context) override {
        const auto all = engine_.sessions();
        auto list = context.getResults().initSessions(static_cast<unsigned>(all.size()));
        for (unsigned i = 0; i < all.size(); ++i) {
            list[i].setId(all[i].id);
            list[i].setMessages(all[i].messages);
            list[i].setIdleSeconds(all[i].idle_seconds);
        }
        return kj::READY_NOW;
    }

  private:
    ChatEngine& engine_;
};

class GatewayImpl final : public rpc::Gateway::Server {
  public:
    GatewayImpl(ChatEngine& engine, RpcThread& rpc, const ChatRpcOptions& options)
        : engine_(engine), rpc_(rpc), options_(options) {}
    kj::Promise<void> chat(ChatContext context) override {
        context.getResults().setService(kj::heap<ChatServiceImpl>(engine_, rpc_, options_));
        return kj::READY_NOW;
    }
    kj::Promise<void> admin(AdminContext context) override {
        context.getResults().setAdmin(kj::heap<AdminImpl>(engine_));
        return kj::READY_NOW;
    }

  private:
    ChatEngine& engine_;
    RpcThread& rpc_;
    const ChatRpcOptions& options_;
};

class ChatRpcServerImpl final : public ChatRpcServer {
  public:
    ChatRpcServerImpl(ChatEngine& engine, const ChatRpcOptions& options)
        : engine_(engine), options_(options) {}
    Status start(const std::string& address) {
        return rpc_.start(address, [this]() -> capnp::Capability::Client {
            return kj::heap<GatewayImpl>(engine_, rpc_, options_);
        });
    }
    uint16_t port() const override { return rpc_.port(); }

  private:
    ChatEngine& engine_;
    const ChatRpcOptions options_;
    RpcThread rpc_;
};

}  // namespace

Result<std::unique_ptr<ChatRpcServer>> ChatRpcServer::start(const std::string& address,
                                                            ChatEngine& engine,
                                                            const ChatRpcOptions& options) {
    auto s = std::make_unique<ChatRpcServerImpl>(engine, options);
    DS_RETURN_IF_ERROR(s->start(address));
    return std::unique_ptr<ChatRpcServer>(std::move(s));
}

}  // namespace deltaserve::api
