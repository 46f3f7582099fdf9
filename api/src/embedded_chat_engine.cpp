#include <algorithm>
#include <chrono>

#include "deltaserve/api/chat_engine.h"
#include "deltaserve/common/logging.h"
#include "deltaserve/model/sampler.h"

namespace deltaserve::api {

namespace {

int64_t now_seconds() {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// Text released to the client so far, holding back what may still become a stop string or
// is an incomplete UTF-8 character.
class StopScanner {
  public:
    explicit StopScanner(const std::vector<std::string>& stop) : stop_(stop) {
        for (const std::string& s : stop_) hold_ = std::max(hold_, s.size() - 1);
    }
    // Appends a piece; returns true when a stop string was found (text() is cut before it).
    bool add(const std::string& piece) {
        text_ += piece;
        for (const std::string& s : stop_) {
            const size_t at = text_.find(s, std::max<size_t>(released_, s.size()) - s.size());
            if (at != std::string::npos) {
                text_.resize(at);
                return true;
            }
        }
        return false;
    }
    // The next piece that may be released (empty if none yet); final releases the rest.
    std::string_view release(bool final) {
        size_t end = final ? text_.size() : (text_.size() > hold_ ? text_.size() - hold_ : 0);
        end = std::max(released_, complete_utf8_prefix(std::string_view(text_).substr(0, end)));
        std::string_view out = std::string_view(text_).substr(released_, end - released_);
        released_ = end;
        return out;
    }
    const std::string& text() const { return text_; }

  private:
    const std::vector<std::string>& stop_;
    size_t hold_ = 0;
    std::string text_;
    size_t released_ = 0;
};

}  // namespace

EmbeddedChatEngine::EmbeddedChatEngine(std::unique_ptr<model::Model> model,
                                       std::unique_ptr<model::InferenceContext> ctx,
                                       std::string model_id, EmbeddedOptions options)
    : model_(std::move(model)),
      ctx_(std::move(ctx)),
      model_id_(std::move(model_id)),
      options_(options) {}

EngineStats EmbeddedChatEngine::stats() const {
    EngineStats s;
    s.queued = queued_.load();
    s.sessions = n_sessions_.load();
    s.kv_bytes = kv_bytes_.load();
    s.keep_ratio = keep_ratio_.load();
    return s;
}

void EmbeddedChatEngine::forget_stale(int64_t now) {
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

Result<TurnResult> EmbeddedChatEngine::run_turn(
    const ChatRequest& request, const std::function<bool(std::string_view)>& on_piece) {
    ++queued_;
    std::lock_guard<std::mutex> lock(mu_);
    --queued_;
    const int64_t now = now_seconds();
    forget_stale(now);
    std::vector<model::ChatMessage> conversation;
    Session* session = nullptr;
    if (!request.session_id.empty()) {
        session = &sessions_[request.session_id];
        session->last_used = now;
        conversation = session->history;
    }
    conversation.insert(conversation.end(), request.messages.begin(), request.messages.end());
    auto result = generate(request, conversation, on_piece);
    if (result.ok() && session != nullptr) {
        session->history = std::move(conversation);
        session->history.push_back({"assistant", result->text});
    } else if (session != nullptr && session->history.empty()) {
        sessions_.erase(request.session_id);  // a first turn that failed opens no session
    }
    forget_stale(now);
    n_sessions_ = static_cast<int64_t>(sessions_.size());
    kv_bytes_ = static_cast<int64_t>(ctx_->kv_bytes());
    keep_ratio_ = ctx_->keep_ratio();
    return result;
}

Result<TurnResult> EmbeddedChatEngine::generate(
    const ChatRequest& request, const std::vector<model::ChatMessage>& conversation,
    const std::function<bool(std::string_view)>& on_piece) {
    const auto t0 = std::chrono::steady_clock::now();
    const model::Tokenizer& tok = *model_->tokenizer;
    const std::string prompt =
        model::apply_chat_template(model_->chat_template, conversation, true);
    DS_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, tok.encode(prompt, tok.vocab().add_bos, true));
    if (tokens.empty()) return invalid_argument("the conversation renders to no tokens");
    const int32_t n_ctx = ctx_->n_ctx();
    if (static_cast<int32_t>(tokens.size()) >= n_ctx) {
        return out_of_range("the conversation has " + std::to_string(tokens.size()) +
                            " tokens; the context holds " + std::to_string(n_ctx));
    }
    // Reuse the cached prefix; evaluate at least one token to get logits.
    const size_t common = static_cast<size_t>(
        std::mismatch(cached_.begin(), cached_.end(), tokens.begin(), tokens.end()).first -
        cached_.begin());
    const size_t keep = std::min(common, tokens.size() - 1);
    ctx_->truncate(static_cast<int32_t>(keep));
    cached_.resize(keep);

    TurnResult r;
    r.usage.prompt_tokens = static_cast<int32_t>(tokens.size());
    r.usage.cached_tokens = static_cast<int32_t>(keep);
    model::Sampler sampler(request.sampling);
    for (int32_t t : tokens) sampler.accept(t);
    auto logits = ctx_->eval(std::span<const int32_t>(tokens.data() + keep, tokens.size() - keep));
    if (!logits.ok()) {
        ctx_->truncate(static_cast<int32_t>(keep));
        return logits.status();
    }
    cached_ = tokens;
    StopScanner scan(request.stop);
    int32_t prev = tokens.back();
    bool first = true;
    r.finish_reason = "length";
    for (;;) {
        if (request.max_tokens >= 0 && r.usage.completion_tokens >= request.max_tokens) break;
        const int32_t next = sampler.sample(*logits);
        if (tok.is_eog(next)) {
            r.finish_reason = "stop";
            break;
        }
        ++r.usage.completion_tokens;
        sampler.accept(next);
        const bool stopped = scan.add(tok.token_to_piece(next, prev));
        prev = next;
        const std::string_view piece = scan.release(stopped);
        if (first && (!piece.empty() || stopped)) {
            r.ttft_seconds =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            first = false;
        }
        if (!piece.empty() && !on_piece(piece)) {
            r.finish_reason = "cancelled";
            break;
        }
        if (stopped) {
            r.finish_reason = "stop";
            break;
        }
        if (request.max_tokens >= 0 && r.usage.completion_tokens >= request.max_tokens) break;
        if (ctx_->n_past() >= n_ctx) break;
        const int32_t one[1] = {next};
        logits = ctx_->eval(one);
        if (!logits.ok()) {
            ctx_->truncate(static_cast<int32_t>(cached_.size()));
            return logits.status();
        }
        cached_.push_back(next);
    }
    if (r.finish_reason != "cancelled") {
        const std::string_view rest = scan.release(true);
        if (!rest.empty()) on_piece(rest);
    }
    if (first)
        r.ttft_seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.text = scan.text();
    return r;
}

}  // namespace deltaserve::api
