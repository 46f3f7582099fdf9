#include "deltaserve/api/cluster_chat_engine.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <limits>
#include <optional>

#include "deltaserve/common/logging.h"

namespace deltaserve::api {

namespace {

int64_t now_seconds() {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// Hands the decode worker's pieces to the request's thread: the worker's loop never waits
// on a slow client.
class QueueSink : public decode::TurnSink {
  public:
    bool on_piece(std::string_view piece) override {
        std::lock_guard<std::mutex> lock(mu_);
        pieces_.emplace_back(piece);
        cv_.notify_one();
        return true;
    }
    void on_end(Result<decode::TurnEnd> end) override {
        std::lock_guard<std::mutex> lock(mu_);
        end_.emplace(std::move(end));
        cv_.notify_one();
    }
    // The next piece, or nullopt once the turn ended and every piece was taken.
    std::optional<std::string> next() {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !pieces_.empty() || end_.has_value(); });
        if (pieces_.empty()) return std::nullopt;
        std::string p = std::move(pieces_.front());
        pieces_.pop_front();
        return p;
    }
    Result<decode::TurnEnd> end() {
        std::lock_guard<std::mutex> lock(mu_);
        return *end_;
    }

  private:
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::string> pieces_;
    std::optional<Result<decode::TurnEnd>> end_;
};

}  // namespace

ClusterChatEngine::ClusterChatEngine(const model::Model& model, std::string model_id,
                                     std::vector<DecodeNode*> decode,
                                     std::vector<PrefillNode*> prefill,
                                     ClusterEngineOptions options)
    : model_(model),
      model_id_(std::move(model_id)),
      decode_(std::move(decode)),
      prefill_(std::move(prefill)),
      options_(options) {}

EngineStats ClusterChatEngine::stats() const {
    EngineStats s;
    {
        std::lock_guard<std::mutex> lock(mu_);
        s.sessions = static_cast<int64_t>(sessions_.size());
    }
    double held = 0, full = 0;
    for (auto* d : decode_) {
        auto ds = d->stats();
        if (!ds.ok()) continue;
        s.queued += ds->waiting;
        s.kv_bytes += ds->kv_bytes;
        held += static_cast<double>(ds->kv_bytes);
        full += ds->keep_ratio > 0 ? static_cast<double>(ds->kv_bytes) / ds->keep_ratio : 0;
    }
    s.keep_ratio = full > 0 ? held / full : 1.0;
    s.prefill_retries = prefill_retries_.load();
    for (auto* p : prefill_) {
        auto ps = p->stats();
        if (!ps.ok()) continue;
        s.queued += ps->queued;
        s.kv_bytes_shipped += ps->bytes_shipped;
    }
    return s;
}

std::vector<SessionSummary> ClusterChatEngine::sessions() const {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t now = now_seconds();
    std::vector<SessionSummary> out;
    for (const auto& [id, s] : sessions_) {
        out.push_back({id, static_cast<int32_t>(s.history.size()), now - s.last_used});
    }
    return out;
}

void ClusterChatEngine::forget_session(const std::string& id) {
    DecodeNode* node = nullptr;
    {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = sessions_.find(id);
        if (it == sessions_.end()) return;
        node = it->second.node;
        sessions_.erase(it);
    }
    if (node != nullptr) node->drop_session(id);
}

DecodeNode* ClusterChatEngine::least_loaded_decode(const DecodeNode* except) const {
    DecodeNode* best = nullptr;
    int64_t load = std::numeric_limits<int64_t>::max();
    for (auto* d : decode_) {
        if (d == except) continue;
        auto st = d->stats();
        if (!st.ok()) continue;  // lost
        const int64_t l = st->running + st->waiting;
        if (l < load) best = d, load = l;
    }
    return best;
}

PrefillNode* ClusterChatEngine::least_loaded_prefill(const std::vector<PrefillNode*>& except) const {
    PrefillNode* best = nullptr;
    int64_t load = std::numeric_limits<int64_t>::max();
    for (auto* p : prefill_) {
        if (std::find(except.begin(), except.end(), p) != except.end()) continue;
        auto st = p->stats();
        if (!st.ok()) continue;
        if (st->queued < load) best = p, load = st->queued;
    }
    return best;
}

Status ClusterChatEngine::prefill_turn(const decode::TurnSpec& spec, DecodeNode& node,
                                       int32_t pull_tokens) {
    std::vector<PrefillNode*> tried;
    Status last = unavailable("no prefill node is reachable");
    while (PrefillNode* p = least_loaded_prefill(tried)) {
        if (!tried.empty()) {
            ++prefill_retries_;
            spdlog::warn("gateway: turn {}: {}; retrying on another prefill node", spec.turn_id,
                         last.message());
        }
        tried.push_back(p);
        auto r = p->prefill({spec, node.data_address(), pull_tokens});
        if (r.ok()) return {};
        last = r.status();
        if (last.code() != StatusCode::kUnavailable) break;
    }
    return last;
}

void ClusterChatEngine::forget_stale(int64_t now) {
    for (auto it = sessions_.begin(); it != sessions_.end();) {
        it = now - it->second.last_used > options_.session_ttl_seconds ? sessions_.erase(it)
                                                                       : std::next(it);
    }
    while (static_cast<int32_t>(sessions_.size()) > options_.max_sessions) {
        auto oldest = std::min_element(
            sessions_.begin(), sessions_.end(),
            [](const auto& a, const auto& b) { return a.second.last_used < b.second.last_used; });
        sessions_.erase(oldest);
    }
}

Result<TurnResult> ClusterChatEngine::run_turn(
    const ChatRequest& request, const std::function<bool(std::string_view)>& on_piece) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<model::ChatMessage> conversation;
    DecodeNode* node = nullptr;
    if (!request.session_id.empty()) {
        std::lock_guard<std::mutex> lock(mu_);
        forget_stale(now_seconds());
        auto it = sessions_.find(request.session_id);
        if (it != sessions_.end()) {
            conversation = it->second.history;
            node = it->second.node;
        }
    }
    conversation.insert(conversation.end(), request.messages.begin(), request.messages.end());
    const model::Tokenizer& tok = *model_.tokenizer;
    const std::string prompt = model::apply_chat_template(model_.chat_template, conversation, true);
    decode::TurnSpec spec;
    DS_ASSIGN_OR_RETURN(spec.tokens, tok.encode(prompt, tok.vocab().add_bos, true));
    if (spec.tokens.empty()) return invalid_argument("the conversation renders to no tokens");
    spec.turn_id = next_turn_++;
    spec.session_id = request.session_id;
    spec.sampling = request.sampling;
    spec.max_tokens = request.max_tokens;
    spec.stop = request.stop;
    auto sink = std::make_shared<QueueSink>();
    if (node == nullptr) node = least_loaded_decode(nullptr);
    if (node == nullptr) return unavailable("no decode node is reachable");
    auto planned = node->start_turn(spec, sink);
    if (!planned.ok() && planned.status().code() == StatusCode::kUnavailable) {
        // The session's node is lost: its KV with it. Another node recomputes the history.
        if (DecodeNode* other = least_loaded_decode(node)) {
            node = other;
            planned = node->start_turn(spec, sink);
        }
    }
    DS_ASSIGN_OR_RETURN(const decode::TurnPlan plan, std::move(planned));
    if (plan.remote_prefill) {
        Status st = prefill_turn(spec, *node, plan.pull_tokens);
        if (!st.ok()) node->cancel(spec.turn_id, st);
    }
    TurnResult result;
    bool first = true, cancelled = false;
    while (auto piece = sink->next()) {
        if (first) {
            result.ttft_seconds =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            first = false;
        }
        if (!cancelled && !on_piece(*piece)) {
            cancelled = true;
            node->cancel(spec.turn_id, Status());
        }
    }
    DS_ASSIGN_OR_RETURN(decode::TurnEnd end, sink->end());
    if (first) {
        result.ttft_seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    result.text = std::move(end.text);
    result.finish_reason = cancelled ? "cancelled" : end.finish_reason;
    result.usage.prompt_tokens = end.prompt_tokens;
    result.usage.cached_tokens = end.cached_tokens;
    result.usage.completion_tokens = end.completion_tokens;
    if (!request.session_id.empty()) {
        std::lock_guard<std::mutex> lock(mu_);
        Session& s = sessions_[request.session_id];
        s.history = std::move(conversation);
        s.history.push_back({"assistant", result.text});
        s.node = node;
        s.last_used = now_seconds();
        forget_stale(s.last_used);
    }
    return result;
}

}  // namespace deltaserve::api
