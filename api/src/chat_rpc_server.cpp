#include "deltaserve/api/chat_rpc_server.h"

#include <atomic>
#include <random>

#include "chat.capnp.h"
#include "deltaserve/api/rpc_convert.h"
#include "deltaserve/common/logging.h"
#include "json_body.h"
#include "json_fields.h"
#include "openai_logprobs.h"
#include "openai_response_format.h"
#include "openai_tools.h"
#include "rpc_thread.h"

namespace deltaserve::api {

namespace {

// A send's sampling: the server's defaults where the client left the message's defaults
// (top_p and the repetition penalty 0), then the same check as HTTP requests get.
Result<model::SamplingParams> sampling_of(rpc::SendOptions::Reader o,
                                          const model::SamplingParams& defaults) {
    if (!o.hasSampling()) return defaults;
    auto s = o.getSampling();
    model::SamplingParams p;
    p.temperature = s.getTemperature();
    p.top_k = s.getTopK();
    p.top_p = s.getTopP() == 0 ? defaults.top_p : s.getTopP();
    p.min_p = s.getMinP();
    p.repeat_penalty = s.getRepeatPenalty() == 0 ? 1.0f : s.getRepeatPenalty();
    p.repeat_last_n = s.getRepeatLastN();
    p.seed = s.getSeed();
    p.presence_penalty = s.getPresencePenalty();
    p.frequency_penalty = s.getFrequencyPenalty();
    DS_RETURN_IF_ERROR(model::validate_sampling(p));
    return p;
}

std::string text_of(capnp::Text::Reader t) { return std::string(t.cStr(), t.size()); }

// A JSON field given as text (tools, tool_choice): parsed with the body's limits.
Status json_text_field(capnp::Text::Reader text, const char* field, RequestJson& into) {
    if (text.size() == 0) return Status();
    auto parsed = parse_ordered_json_body(text_of(text));
    if (!parsed.ok()) return bad_field(field, "must be JSON: " + parsed.status().message());
    into[field] = std::move(*parsed);
    return Status();
}

// A message's tool fields as the HTTP message would carry them, through the same checks.
Status message_extras(rpc::Message::Reader m, size_t i, model::ChatMessage& out) {
    RequestJson j = {{"role", out.role}, {"content", out.content}};
    if (m.getToolCallId().size() > 0) j["tool_call_id"] = text_of(m.getToolCallId());
    if (m.getToolCalls().size() > 0) {
        RequestJson calls = RequestJson::array();
        for (auto c : m.getToolCalls()) {
            calls.push_back(
                {{"id", text_of(c.getId())},
                 {"type", "function"},
                 {"function",
                  {{"name", text_of(c.getName())}, {"arguments", text_of(c.getArguments())}}}});
        }
        j["tool_calls"] = std::move(calls);
    }
    return parse_message_extras(j, "messages[" + std::to_string(i) + "]", true, out);
}

Result<ChatRequest> request_of(rpc::ChatSession::SendParams::Reader p,
                               const ChatRpcOptions& options) {
    ChatRequest req;
    if (p.getMessages().size() == 0) return invalid_argument("messages: none given");
    if (p.getMessages().size() > kMaxMessages) return invalid_argument("messages: too many");
    size_t i = 0;
    for (auto m : p.getMessages()) {
        const std::string role = m.getRole();
        if (role != "system" && role != "user" && role != "assistant" && role != "developer" &&
            role != "tool") {
            return invalid_argument("messages: unknown role '" + role.substr(0, 32) + "'");
        }
        std::string content = m.getContent();
        if (model::find_invalid_utf8(content) >= 0)
            return invalid_argument("messages: content is not valid UTF-8");
        model::ChatMessage message{role == "developer" ? "system" : role, std::move(content)};
        DS_RETURN_IF_ERROR(message_extras(m, i++, message));
        req.messages.push_back(std::move(message));
    }
    auto o = p.getOptions();
    DS_ASSIGN_OR_RETURN(req.sampling, sampling_of(o, options.sampling));
    if (!o.getSeedGiven()) req.sampling.seed = std::random_device{}();
    req.max_tokens = o.getMaxTokens() >= 0 ? o.getMaxTokens() : options.default_max_tokens;
    if (o.getStop().size() > kMaxStopStrings)
        return invalid_argument("stop: more than " + std::to_string(kMaxStopStrings) + " strings");
    for (auto s : o.getStop()) {
        if (s.size() == 0 || s.size() > kMaxStopBytes)
            return invalid_argument("stop: a string must have 1 to " +
                                    std::to_string(kMaxStopBytes) + " bytes");
        req.stop.emplace_back(s.cStr());
    }
    // Tools, tool_choice and logprobs: the HTTP request's fields, through its checks.
    RequestJson fields = RequestJson::object();
    DS_RETURN_IF_ERROR(json_text_field(o.getTools(), "tools", fields));
    DS_RETURN_IF_ERROR(json_text_field(o.getToolChoice(), "tool_choice", fields));
    fields["parallel_tool_calls"] = o.getParallelToolCalls();
    if (o.getTopLogprobs() >= 0) {
        fields["logprobs"] = true;
        fields["top_logprobs"] = o.getTopLogprobs();
    } else if (o.getTopLogprobs() != -1) {
        return bad_field("top_logprobs", "must be -1 (none) or in [0, 20]");
    }
    DS_RETURN_IF_ERROR(parse_tool_fields(fields, req));
    DS_RETURN_IF_ERROR(parse_logprobs_fields(fields, req.top_logprobs));
    DS_RETURN_IF_ERROR(set_response_schema(
        std::string_view(o.getJsonSchema().cStr(), o.getJsonSchema().size()), req));
    if (req.force_tool_call && !req.json_schema.empty()) {
        return bad_field("tool_choice", "cannot force a call and a response_format together");
    }
    return req;
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
                    std::string tenant, std::string id)
        : engine_(engine),
          rpc_(rpc),
          options_(options),
          tenant_(std::move(tenant)),
          id_(std::move(id)) {}

    kj::Promise<void> send(SendContext context) override {
        auto p = context.getParams();
        auto results = context.getResults();
        if (running_ && !running_->cancelled.load()) {
            rpc::to_capnp(failed_precondition("session " + id_ + " has a send running"),
                          results.initError());
            return kj::READY_NOW;
        }
        auto parsed = request_of(p, options_);
        if (!parsed.ok()) {
            rpc::to_capnp(parsed.status(), results.initError());
            return kj::READY_NOW;
        }
        ChatRequest req = std::move(*parsed);
        req.session_id = id_;
        req.tenant = tenant_;
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
        const bool queued = rpc_.spawn([&engine, &rpc, req = std::move(req), state, done,
                                        sink_holder] {
            TurnCallbacks callbacks;
            callbacks.wanted = [&] { return !state->cancelled.load(); };
            callbacks.on_piece = [&](std::string_view piece) {
                if (state->cancelled) return false;
                try {
                    execute_sync(rpc.executor(), [&] {
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
            };
            state->out = engine.run_turn(req, callbacks);
            try {  // the capability goes on the RPC thread, where it lives
                execute_sync(rpc.executor(), [&] { sink_holder->own = nullptr; });
            } catch (const kj::Exception&) {
            }
            handoff_release(state.get());
            done->own->fulfill();
        });
        if (!queued) {
            running_.reset();
            rpc::to_capnp(resource_exhausted("the server is busy: every send thread is taken; "
                                             "try again"),
                          results.initError());
            return kj::READY_NOW;
        }
        return paf.promise
            .then([state]() {
                handoff_acquire(state.get());
                return kj::joinPromises(state->pieces.releaseAsArray());
            })
            .then([this, state, context]() mutable {
                if (running_ == state) running_.reset();
                auto r = context.getResults();
                if (!state->out.ok()) return rpc::to_capnp(state->out.status(), r.initError());
                r.setFinishReason(state->cancelled ? "cancelled" : state->out->finish_reason);
                r.setText(state->out->text);
                const auto& calls = state->out->tool_calls;
                auto c = r.initToolCalls(static_cast<unsigned>(calls.size()));
                for (unsigned i = 0; i < calls.size(); ++i) {
                    c[i].setId(calls[i].id);
                    c[i].setName(calls[i].name);
                    c[i].setArguments(calls[i].arguments);
                }
                const auto& lps = state->out->logprobs;
                auto l = r.initLogprobs(static_cast<unsigned>(lps.size()));
                for (unsigned i = 0; i < lps.size(); ++i) {
                    const auto put = [](const LogprobToken& t, rpc::LogprobToken::Builder b) {
                        b.setBytes(kj::arrayPtr(reinterpret_cast<const kj::byte*>(t.bytes.data()),
                                                t.bytes.size()));
                        b.setLogprob(t.logprob);
                    };
                    put(lps[i].chosen, l[i].initChosen());
                    auto top = l[i].initTop(static_cast<unsigned>(lps[i].top.size()));
                    for (unsigned k = 0; k < lps[i].top.size(); ++k) put(lps[i].top[k], top[k]);
                }
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
        (void)engine_.close_session(tenant_, id_);  // closed already: nothing to do
        return kj::READY_NOW;
    }
    kj::Promise<void> info(InfoContext context) override {
        auto r = context.getResults();
        r.setId(id_);
        auto info = engine_.session_info(tenant_, id_);
        if (!info.ok()) {
            rpc::to_capnp(info.status(), r.initError());
            return kj::READY_NOW;
        }
        r.setMessages(info->messages);
        r.setTurns(info->turns);
        r.setTokens(info->tokens);
        r.setCachedTokens(info->cached_tokens);
        return kj::READY_NOW;
    }

  private:
    ChatEngine& engine_;
    RpcThread& rpc_;
    const ChatRpcOptions& options_;
    const std::string tenant_, id_;
    std::shared_ptr<SendState> running_;
};

class ChatServiceImpl final : public rpc::ChatService::Server {
  public:
    ChatServiceImpl(ChatEngine& engine, RpcThread& rpc, const ChatRpcOptions& options,
                    std::string tenant)
        : engine_(engine), rpc_(rpc), options_(options), tenant_(std::move(tenant)) {}
    kj::Promise<void> open(OpenContext context) override {
        const std::string id = context.getParams().getSessionId();
        auto r = context.getResults();
        auto info =
            id.empty() ? engine_.open_session(tenant_, "") : engine_.session_info(tenant_, id);
        if (!info.ok()) {
            rpc::to_capnp(info.status(), r.initError());
            return kj::READY_NOW;
        }
        r.setSession(kj::heap<ChatSessionImpl>(engine_, rpc_, options_, tenant_, info->id));
        return kj::READY_NOW;
    }
    kj::Promise<void> create(CreateContext context) override {
        auto r = context.getResults();
        auto info = engine_.open_session(tenant_, context.getParams().getSessionId());
        if (!info.ok()) {
            rpc::to_capnp(info.status(), r.initError());
            return kj::READY_NOW;
        }
        r.setSession(kj::heap<ChatSessionImpl>(engine_, rpc_, options_, tenant_, info->id));
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
    const std::string tenant_;
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
            list[i].setTenant(all[i].tenant);
            list[i].setTurns(all[i].turns);
            list[i].setTokens(all[i].tokens);
        }
        return kj::READY_NOW;
    }

    kj::Promise<void> sessionPage(SessionPageContext context) override {
        const auto p = context.getParams();
        const SessionPage page = engine_.session_page(p.getAfter().cStr(), p.getLimit());
        auto r = context.getResults();
        auto list = r.initSessions(static_cast<unsigned>(page.rows.size()));
        for (unsigned i = 0; i < page.rows.size(); ++i) {
            const SessionRow& s = page.rows[i];
            auto b = list[i];
            b.setId(s.info.id);
            b.setTenant(s.info.tenant);
            b.setNode(s.node);
            b.setTurns(s.info.turns);
            b.setMessages(s.info.messages);
            b.setTokens(s.info.tokens);
            b.setLastUseUnix(s.last_use_unix);
            b.setTtlLeftSeconds(s.ttl_left_seconds);
            b.setRunning(s.info.running);
            b.setInMemory(s.in_memory);
            rpc::to_capnp(s.kv, b.initKv());
        }
        r.setNext(page.next);
        return kj::READY_NOW;
    }
    kj::Promise<void> nodes(NodesContext context) override {
        const auto all = engine_.node_stats();
        auto list = context.getResults().initNodes(static_cast<unsigned>(all.size()));
        for (unsigned i = 0; i < all.size(); ++i) set(all[i], list[i]);
        return kj::READY_NOW;
    }
    kj::Promise<void> dropSession(DropSessionContext context) override {
        const auto p = context.getParams();
        const Status s = engine_.close_session(p.getTenant().cStr(), p.getId().cStr());
        if (!s.ok()) rpc::to_capnp(s, context.getResults().initError());
        return kj::READY_NOW;
    }
    kj::Promise<void> evictSession(EvictSessionContext context) override {
        const auto p = context.getParams();
        const Status s = engine_.evict_session(p.getTenant().cStr(), p.getId().cStr());
        if (!s.ok()) rpc::to_capnp(s, context.getResults().initError());
        return kj::READY_NOW;
    }
    kj::Promise<void> pinSession(PinSessionContext context) override {
        const auto p = context.getParams();
        const Status s = engine_.pin_session(p.getTenant().cStr(), p.getId().cStr(), p.getPinned());
        if (!s.ok()) rpc::to_capnp(s, context.getResults().initError());
        return kj::READY_NOW;
    }
    kj::Promise<void> sessionBlocks(SessionBlocksContext context) override {
        const auto p = context.getParams();
        auto r = context.getResults();
        std::string node;
        auto b = engine_.session_blocks(p.getTenant().cStr(), p.getId().cStr(), &node);
        if (!b.ok()) {
            rpc::to_capnp(b.status(), r.initError());
            return kj::READY_NOW;
        }
        r.setNode(node);
        rpc::to_capnp(*b, r.initBlocks());
        return kj::READY_NOW;
    }
    kj::Promise<void> readBlock(ReadBlockContext context) override {
        const auto p = context.getParams();
        auto r = context.getResults();
        auto b = engine_.read_block(p.getNode().cStr(), p.getKey(), p.getLimit());
        if (!b.ok()) {
            rpc::to_capnp(b.status(), r.initError());
            return kj::READY_NOW;
        }
        r.setBytes(kj::arrayPtr(reinterpret_cast<const kj::byte*>(b->data()), b->size()));
        return kj::READY_NOW;
    }
    kj::Promise<void> checkpoint(CheckpointContext context) override {
        auto r = context.getResults();
        auto paths = engine_.checkpoint(context.getParams().getName().cStr());
        if (!paths.ok()) {
            rpc::to_capnp(paths.status(), r.initError());
            return kj::READY_NOW;
        }
        auto list = r.initPaths(static_cast<unsigned>(paths->size()));
        for (unsigned i = 0; i < paths->size(); ++i) list.set(i, (*paths)[i]);
        return kj::READY_NOW;
    }
    kj::Promise<void> cluster(ClusterContext context) override {
        const ClusterView v = engine_.cluster();
        auto r = context.getResults();
        r.setVersion(v.version);
        r.setModel(v.model_id);
        auto d = r.initDecode(static_cast<unsigned>(v.decode.size()));
        for (unsigned i = 0; i < v.decode.size(); ++i) set(v.decode[i], d[i]);
        auto p = r.initPrefill(static_cast<unsigned>(v.prefill.size()));
        for (unsigned i = 0; i < v.prefill.size(); ++i) {
            p[i].setName(v.prefill[i].name);
            p[i].setRpcAddress(v.prefill[i].rpc_address);
            p[i].setVersion(v.prefill[i].version);
            if (!v.prefill[i].status.ok()) rpc::to_capnp(v.prefill[i].status, p[i].initError());
            rpc::to_capnp(v.prefill[i].stats, p[i].initStats());
        }
        return kj::READY_NOW;
    }

  private:
    static void set(const NodeStats& n, rpc::NodeStats::Builder b) {
        b.setName(n.name);
        b.setRpcAddress(n.rpc_address);
        b.setDataAddress(n.data_address);
        b.setVersion(n.version);
        if (!n.status.ok()) rpc::to_capnp(n.status, b.initError());
        rpc::to_capnp(n.stats, b.initStats());
    }

    ChatEngine& engine_;
};

class GatewayImpl final : public rpc::Gateway::Server {
  public:
    GatewayImpl(ChatEngine& engine, RpcThread& rpc, const ChatRpcOptions& options,
                const AccessControl& access)
        : engine_(engine), rpc_(rpc), options_(options), access_(access) {}
    kj::Promise<void> chat(ChatContext context) override {
        auto r = context.getResults();
        auto tenant = access_.tenant(context.getParams().getApiKey().cStr());
        if (!tenant.ok()) {
            spdlog::warn("chat RPC: refused a client: {}", tenant.status().message());
            rpc::to_capnp(tenant.status(), r.initError());
            return kj::READY_NOW;
        }
        r.setService(kj::heap<ChatServiceImpl>(engine_, rpc_, options_, *tenant));
        return kj::READY_NOW;
    }
    kj::Promise<void> admin(AdminContext context) override {
        auto r = context.getResults();
        if (!access_.admin(context.getParams().getAdminKey().cStr())) {
            spdlog::warn("chat RPC: refused an admin client: wrong or missing admin key");
            rpc::to_capnp(unauthenticated("the admin service needs an admin key"), r.initError());
            return kj::READY_NOW;
        }
        r.setAdmin(kj::heap<AdminImpl>(engine_));
        return kj::READY_NOW;
    }

  private:
    ChatEngine& engine_;
    RpcThread& rpc_;
    const ChatRpcOptions& options_;
    const AccessControl& access_;
};

class ChatRpcServerImpl final : public ChatRpcServer {
  public:
    ChatRpcServerImpl(ChatEngine& engine, const ChatRpcOptions& options)
        : engine_(engine),
          options_(options),
          access_(options.access),
          rpc_(options.max_running_sends, options.max_queued_sends) {}
    Status start(const std::string& address) {
        return rpc_.start(address, [this]() -> capnp::Capability::Client {
            return kj::heap<GatewayImpl>(engine_, rpc_, options_, access_);
        });
    }
    uint16_t port() const override { return rpc_.port(); }

  private:
    ChatEngine& engine_;
    const ChatRpcOptions options_;
    const AccessControl access_;
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
