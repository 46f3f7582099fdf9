#include "deltaserve/prefill/prefill_worker.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>

#include "deltaserve/decode/kv_stream_io.h"
#include "deltaserve/model/constraint_factory.h"
#include "deltaserve/model/sampler.h"
#include "deltaserve/model/token_logprobs.h"
#include "deltaserve/transport/kv_stream.h"
#include "deltaserve/transport/wire_format.h"

namespace deltaserve::prefill {

namespace {

using transport::StreamHeader;
using transport::StreamKind;

class PrefillWorkerImpl final : public PrefillWorker {
  public:
    PrefillWorkerImpl(const model::Model& model, PrefillOptions options,
                      transport::Transport& transport, std::unique_ptr<model::InferenceContext> ctx)
        : model_(model),
          options_(std::move(options)),
          transport_(transport),
          ctx_(std::move(ctx)),
          ids_{options_.model_id, options_.profile_id, decode::kv_codec(options_.context)},
          constraints_(*model.tokenizer) {}

    ~PrefillWorkerImpl() override {
        for (auto& [address, conn] : connections_) conn->close();
    }

    Result<PrefillResult> prefill(const PrefillRequest& request) override {
        DS_RETURN_IF_ERROR(model::validate_sampling(request.turn.sampling));
        if (request.turn.logprobs < -1 || request.turn.logprobs > model::kMaxTopLogprobs)
            return invalid_argument("a turn's top logprobs must be -1 (none) to " +
                                    std::to_string(model::kMaxTopLogprobs));
        const uint64_t id = request.turn.turn_id;
        const bool admitted = enter(id);
        const auto t0 = std::chrono::steady_clock::now();
        auto r = admitted ? run(request) : Result<PrefillResult>(cancelled_status());
        if (admitted) ctx_->reset();
        const bool was_cancelled = leave(id, admitted);
        std::lock_guard<std::mutex> sl(stats_mu_);
        ++stats_.requests;
        if (!r.ok()) {
            if (!was_cancelled) ++stats_.failures;
            return r;
        }
        r->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        stats_.tokens += r->prefilled_tokens;
        stats_.bytes_shipped += r->bytes_shipped;
        return r;
    }

    void cancel(uint64_t turn_id) override {
        std::lock_guard<std::mutex> ql(queue_mu_);
        if (active_.count(turn_id) == 0) return;
        cancelled_.insert(turn_id);
        queue_cv_.notify_all();
    }

    PrefillStats stats() const override {
        std::lock_guard<std::mutex> sl(stats_mu_);
        PrefillStats s = stats_;
        {
            std::lock_guard<std::mutex> ql(queue_mu_);
            s.queued = static_cast<int64_t>(waiting_.size()) + (busy_ ? 1 : 0);
        }
        return s;
    }

  private:
    bool cancelled(uint64_t turn_id) const {
        std::lock_guard<std::mutex> ql(queue_mu_);
        return cancelled_.count(turn_id) != 0;
    }
    // Queues a prefill of the turn and waits for its go: true when it may run (its caller
    // holds the worker until leave()), false when it was cancelled while it waited.
    bool enter(uint64_t turn_id) {
        std::unique_lock<std::mutex> ql(queue_mu_);
        ++active_[turn_id];
        const uint64_t ticket = next_ticket_++;
        waiting_.push_back(ticket);
        queue_cv_.wait(ql, [&] {
            return (!busy_ && waiting_.front() == ticket) || cancelled_.count(turn_id) != 0;
        });
        std::erase(waiting_, ticket);
        if (cancelled_.count(turn_id) != 0) {
            queue_cv_.notify_all();  // the next in line may be first now
            return false;
        }
        busy_ = true;
        return true;
    }
    // Ends what enter() began; whether the turn was cancelled.
    bool leave(uint64_t turn_id, bool admitted) {
        std::lock_guard<std::mutex> ql(queue_mu_);
        const bool was = cancelled_.count(turn_id) != 0;
        if (--active_[turn_id] == 0) {
            active_.erase(turn_id);
            cancelled_.erase(turn_id);
        }
        if (admitted) busy_ = false;
        queue_cv_.notify_all();
        return was;
    }
    static Status cancelled_status() { return failed_precondition("the turn was cancelled"); }
    transport::Deadline transfer_deadline() const {
        return transport::deadline_in(std::chrono::milliseconds(options_.transfer_timeout_ms));
    }
    Result<std::shared_ptr<transport::Connection>> connection_to(const std::string& address);
    Result<PrefillResult> run(const PrefillRequest& request);
    // Takes the session's first n tokens from the decode node into ctx_.
    Status pull(transport::Connection& conn, const decode::TurnSpec& turn, int32_t n);
    // Prefills tokens [from, end); returns the last logits.
    Result<std::vector<float>> eval_from(const decode::TurnSpec& turn, int32_t from) {
        DS_ASSIGN_OR_RETURN(auto last,
                            ctx_->eval(std::span<const int32_t>(turn.tokens).subspan(from)));
        return std::vector<float>(last.begin(), last.end());
    }
    // Prefills tokens [from, end) in chunks, shipping rows from the layer observer; returns
    // the last logits.
    Result<std::vector<float>> prefill_shipping_rows(transport::Connection& conn,
                                                     const decode::TurnSpec& turn, int32_t from);

    const model::Model& model_;
    const PrefillOptions options_;
    transport::Transport& transport_;
    std::unique_ptr<model::InferenceContext> ctx_;
    const decode::KvStreamIds ids_;
    model::ConstraintFactory constraints_;  // the first token of a structured answer
    std::map<std::string, std::shared_ptr<transport::Connection>> connections_;
    // One request at a time, in the order they came (enter, leave): the waiting tickets,
    // whether one runs, the turns of prefill() calls under way (a count per id: a retried
    // turn may come twice) and those of them cancel() named.
    mutable std::mutex queue_mu_;
    std::condition_variable queue_cv_;
    std::deque<uint64_t> waiting_;
    uint64_t next_ticket_ = 0;
    bool busy_ = false;
    std::map<uint64_t, int32_t> active_;
    std::set<uint64_t> cancelled_;
    mutable std::mutex stats_mu_;
    PrefillStats stats_;
};

Result<std::shared_ptr<transport::Connection>> PrefillWorkerImpl::connection_to(
    const std::string& address) {
    auto it = connections_.find(address);
    if (it != connections_.end()) {
        if (it->second->status().ok()) return it->second;
        connections_.erase(it);
    }
    DS_ASSIGN_OR_RETURN(
        auto conn, transport_.connect(address, transport::deadline_in(std::chrono::milliseconds(
                                                   options_.connect_timeout_ms))));
    std::shared_ptr<transport::Connection> shared(std::move(conn));
    DS_RETURN_IF_ERROR(decode::prove_to_peer(
        *shared, options_.cluster_token,
        transport::deadline_in(std::chrono::milliseconds(options_.connect_timeout_ms))));
    connections_[address] = shared;
    return shared;
}

Result<PrefillResult> PrefillWorkerImpl::run(const PrefillRequest& request) {
    const decode::TurnSpec& turn = request.turn;
    const int32_t n = static_cast<int32_t>(turn.tokens.size());
    if (n == 0) return invalid_argument("the prompt has no tokens");
    if (n >= ctx_->n_ctx()) {
        return out_of_range("the conversation has " + std::to_string(n) +
                            " tokens; the context holds " + std::to_string(ctx_->n_ctx()));
    }
    if (request.pull_tokens < 0 || request.pull_tokens >= n) {
        return invalid_argument("cannot pull " + std::to_string(request.pull_tokens) + " of " +
                                std::to_string(n) + " prompt tokens");
    }
    if (turn.continued != 0 || turn.continued_sent != 0)
        return invalid_argument("a prefill node computes a continued turn's prompt only");
    std::unique_ptr<model::TokenConstraint> constraint;
    if (!turn.json_schema.empty()) {
        DS_ASSIGN_OR_RETURN(
            constraint, constraints_.make(turn.json_schema, turn.json_prefix, turn.json_suffix));
    }
    DS_ASSIGN_OR_RETURN(auto conn, connection_to(request.decode_address));
    const uint64_t sent_before = conn->stats().bytes_sent;
    PrefillResult result;
    ctx_->reset();
    if (request.pull_tokens > 0) {
        Status st = pull(*conn, turn, request.pull_tokens);
        if (st.ok()) {
            result.pulled_tokens = request.pull_tokens;
        } else if (st.code() == StatusCode::kFailedPrecondition) {
            ctx_->reset();  // the decode node no longer holds it: recompute, slower but right
        } else {
            connections_.erase(request.decode_address);
            return st;
        }
    }
    result.prefilled_tokens = n - result.pulled_tokens;
    const bool rows = ctx_->kv_ships_rows();
    auto logits = rows ? prefill_shipping_rows(*conn, turn, result.pulled_tokens)
                       : eval_from(turn, result.pulled_tokens);
    Status st = logits.status();
    if (st.ok()) {
        model::Sampler sampler(turn.sampling);
        for (int32_t t : turn.tokens) sampler.accept(t);
        result.first_token = constraint == nullptr ? sampler.sample(*logits)
                                                   : sampler.sample(*logits, constraint->allowed());
        if (result.first_token < 0) {
            // No token of the vocabulary can begin the format: the turn fails (aborted below).
            st = internal_error(
                "constrained decoding: no token of the vocabulary can begin "
                "the response format");
        } else {
            // The kEnd message names the first token, and carries its log-probabilities when
            // the turn reports them.
            const std::string first_logprobs =
                turn.logprobs < 0 ? std::string()
                                  : model::encode_token_logprobs(model::token_logprobs(
                                        *logits, result.first_token, turn.logprobs));
            if (rows) {
                StreamHeader h;
                h.kind = StreamKind::kEnd;
                h.turn = turn.turn_id;
                h.token = result.first_token;
                h.message = first_logprobs;
                st = decode::send_stream_message(*conn, h, ctx_->export_kv_hints(),
                                                 transfer_deadline());
            } else {
                st = decode::send_kv(*conn, *ctx_, turn.turn_id, turn.session_id, ids_,
                                     result.first_token, first_logprobs, transfer_deadline());
            }
        }
    }
    if (st.ok()) st = conn->flush(transfer_deadline());
    if (!st.ok()) {
        if (conn->status().ok()) {
            decode::send_abort(*conn, turn.turn_id, st.message());
        } else {
            connections_.erase(request.decode_address);
        }
        return st;
    }
    result.bytes_shipped = static_cast<int64_t>(conn->stats().bytes_sent - sent_before);
    return result;
}

Status PrefillWorkerImpl::pull(transport::Connection& conn, const decode::TurnSpec& turn,
                               int32_t n) {
    StreamHeader h;
    h.kind = StreamKind::kPull;
    h.turn = turn.turn_id;
    h.session = turn.session_id;
    h.n_tokens = n;
    DS_RETURN_IF_ERROR(decode::send_stream_message(conn, h, {}, transfer_deadline()));
    std::vector<int32_t> covered;
    for (;;) {
        DS_ASSIGN_OR_RETURN(auto m, conn.receive(transfer_deadline()));
        DS_ASSIGN_OR_RETURN(auto r, transport::decode_stream_header(m.header));
        if (r.turn != turn.turn_id) continue;  // the rest of an earlier, abandoned pull
        const auto payload = std::span<const uint8_t>(
            reinterpret_cast<const uint8_t*>(m.payload.data()), m.payload.size());
        switch (r.kind) {
            case StreamKind::kBegin:
                if (r.n_tokens != n)
                    return data_loss("the decode node sent " + std::to_string(r.n_tokens) +
                                     " history tokens, not " + std::to_string(n));
                DS_RETURN_IF_ERROR(ctx_->import_kv_state(payload));
                covered.assign(static_cast<size_t>(model_.config.n_layers), 0);
                break;
            case StreamKind::kPart: {
                if (covered.empty()) return data_loss("history KV before its state");
                DS_ASSIGN_OR_RETURN(
                    auto s, transport::decode_shipment(payload, ids_.model_id, ids_.profile_id));
                DS_RETURN_IF_ERROR(decode::import_part(*ctx_, s, turn.session_id, covered));
                break;
            }
            case StreamKind::kEnd:
                if (covered.empty()) return data_loss("history KV ended before its state");
                return decode::check_complete(*ctx_, covered);
            case StreamKind::kAbort:
                return failed_precondition("the decode node did not send the history: " +
                                           r.message);
            case StreamKind::kPull:
            case StreamKind::kChallenge:
            case StreamKind::kProof:
                return invalid_argument("a decode node sent a message that has no place here");
        }
    }
}

Result<std::vector<float>> PrefillWorkerImpl::prefill_shipping_rows(transport::Connection& conn,
                                                                    const decode::TurnSpec& turn,
                                                                    int32_t from) {
    const int32_t n = static_cast<int32_t>(turn.tokens.size());
    const int32_t n_layers = model_.config.n_layers;
    StreamHeader h;
    h.kind = StreamKind::kBegin;
    h.turn = turn.turn_id;
    h.session = turn.session_id;
    h.n_tokens = n;
    DS_ASSIGN_OR_RETURN(auto state, ctx_->export_kv_rows_state(n));
    DS_RETURN_IF_ERROR(decode::send_stream_message(conn, h, state, transfer_deadline()));
    // Ships the rows of a layer that are final and not sent yet: while the forward pass
    // runs, up to kv_rows_final_end (a compressing cache may still change its recent rows;
    // in the last chunk, every row once final); after the last chunk, whatever is left. A
    // layer's rows may become final at a later layer (DeltaKV keeping tokens exact decides
    // once its judging layers ran), so each layer's observer looks at every layer up to it.
    std::vector<int32_t> shipped(static_cast<size_t>(n_layers), 0);
    int32_t b = from, e = from;
    bool done = false;
    const auto ship = [&](int32_t layer) -> Status {
        const int32_t end = done ? n : ctx_->kv_rows_final_end(layer, e == n);
        int32_t& begin = shipped[static_cast<size_t>(layer)];
        if (end <= begin) return {};
        DS_ASSIGN_OR_RETURN(auto rows, ctx_->export_kv_rows(layer, begin, end));
        DS_RETURN_IF_ERROR(decode::send_part(conn, turn.turn_id, turn.session_id, ids_, layer,
                                             n_layers, begin, end, rows, transfer_deadline()));
        begin = end;
        return {};
    };
    for (int32_t l = 0; l < n_layers && from > 0; ++l) DS_RETURN_IF_ERROR(ship(l));
    const int32_t chunk = std::max<int32_t>(1, options_.context.n_batch);
    Status shipping;
    ctx_->set_layer_observer([&](int32_t layer) {
        for (int32_t l = 0; l <= layer && shipping.ok(); ++l) shipping = ship(l);
    });
    std::vector<float> logits;
    Status st;
    for (; b < n && st.ok() && shipping.ok(); b = e) {
        if (cancelled(turn.turn_id)) {
            st = cancelled_status();
            break;
        }
        e = std::min(n, b + chunk);
        ctx_->expect_more(n - e);  // a compressing cache compresses the prompt at its end
        auto r = ctx_->eval(
            std::span<const int32_t>(turn.tokens.data() + b, static_cast<size_t>(e - b)));
        if (r.ok() && e == n) logits.assign(r->begin(), r->end());
        st = r.status();
    }
    ctx_->set_layer_observer(nullptr);
    DS_RETURN_IF_ERROR(st);
    DS_RETURN_IF_ERROR(shipping);
    done = true;
    for (int32_t l = 0; l < n_layers; ++l) DS_RETURN_IF_ERROR(ship(l));
    return logits;
}

}  // namespace

Result<std::unique_ptr<PrefillWorker>> PrefillWorker::create(const model::Model& model,
                                                             PrefillOptions options,
                                                             transport::Transport& transport) {
    DS_ASSIGN_OR_RETURN(auto ctx, model::InferenceContext::create(model, options.context));
    return std::unique_ptr<PrefillWorker>(
        new PrefillWorkerImpl(model, std::move(options), transport, std::move(ctx)));
}

}  // namespace deltaserve::prefill
