// A chat turn (or a text completion's) on a connection: queued on the turn runner (at most
// the queue timeout), run on a turn thread, its pieces streamed as server-sent events or
// gathered into one answer.
#include <algorithm>
#include <boost/asio/post.hpp>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>

#include "choices_runner.h"
#include "deltaserve/common/logging.h"
#include "gateway_core.h"
#include "http_connection.h"
#include "openai_completions.h"
#include "openai_generation.h"
#include "random_id.h"

namespace deltaserve::api {

namespace asio = boost::asio;
namespace beast = boost::beast;

namespace {

int64_t unix_seconds() {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

std::string sse_event(const std::string& data) { return format_chunk("data: " + data + "\n\n"); }

}  // namespace

void Connection::chat() {
    const auto& req = parser_->get();
    started_ = std::chrono::steady_clock::now();
    auto parsed = parse_chat_request(req.body(), g_.options.sampling);
    if (!parsed.ok()) {
        g_.metrics.request_failed();
        return answer(status_answer(parsed.error()));
    }
    request_ = std::move(*parsed);
    completion_ = false;
    if (request_.session_id.empty() && req.find("X-Session-ID") != req.end()) {
        request_.session_id = std::string(req["X-Session-ID"]);
        if (Status st = check_session_id(request_.session_id, "X-Session-ID"); !st.ok()) {
            g_.metrics.request_failed();
            return answer(status_answer(st));
        }
    }
    start_turn("chatcmpl-");
}

void Connection::completion() {
    started_ = std::chrono::steady_clock::now();
    auto parsed = parse_completion_request(parser_->get().body(), g_.options.sampling);
    if (!parsed.ok()) {
        g_.metrics.request_failed();
        return answer(status_answer(parsed.error()));
    }
    request_ = std::move(parsed->turn);
    completion_ = true;
    echo_ = parsed->echo;
    echoed_top_ = parsed->echoed_top;
    listed_top_ = parsed->listed_top;
    const model::Tokenizer& tok = *g_.engine.model().tokenizer;
    const auto& ids = request_.prompt_ids;
    if (echo_ && !ids.empty() && std::all_of(ids.begin(), ids.end(), [&](int32_t id) {
            return id >= 0 && id < tok.vocab_size();
        })) {
        request_.prompt_text = tok.decode(ids, true);  // the echo of a prompt of ids
    }
    start_turn("cmpl-");
}

void Connection::start_turn(const char* id_prefix) {
    const std::string& model = g_.engine.model_id();
    if (!request_.model.empty() && request_.model != model) {
        g_.metrics.request_failed();
        return answer(error_answer(
            404,
            "the model '" + request_.model + "' does not exist (this server has '" + model + "')",
            "model_not_found"));
    }
    if (request_.n > 1 && !request_.session_id.empty()) {
        g_.metrics.request_failed();
        return answer(status_answer(
            bad_field("n", "above 1 cannot continue a session (which choice would it keep?)")));
    }
    request_.tenant = tenant_;  // a session not open (or another key's) ends the turn: 404
    if (request_.max_tokens < 0) request_.max_tokens = g_.options.default_max_tokens;
    if (!request_.seed_given) request_.sampling.seed = std::random_device{}();
    id_ = random_id(id_prefix, 12);
    text_offset_ = 0;
    created_ = unix_seconds();
    head_sent_ = false;
    stream_keep_alive_ = keep_alive_ && !draining_ && !g_.stopping;
    in_turn_ = true;
    pending_logprobs_.clear();
    if (request_.stream) {
        // Small, so that a client that stops reading fills outbox_ (write deadline,
        // max_unread_bytes) instead of megabytes of kernel buffer.
        beast::error_code ec;
        socket_.set_option(asio::socket_base::send_buffer_size(g_.options.stream_send_buffer_bytes),
                           ec);
    }
    auto self = shared_from_this();
    const uint64_t ticket = g_.runner.try_submit([self] {
        asio::post(self->socket_.get_executor(), [self] { self->queue_timer_.cancel(); });
        TurnCallbacks callbacks;
        callbacks.on_piece = [&](std::string_view piece) { return self->on_piece(piece); };
        callbacks.on_tool_call = [&](int index, const model::ToolCall& call) {
            return self->on_tool_call(index, call);
        };
        if (self->request_.top_logprobs >= 0 && self->request_.stream) {
            callbacks.on_logprobs = [&](const LogprobEntry& e) { self->on_logprobs(e); };
        }
        callbacks.wanted = [&] { return self->alive_ && !self->g_.cut; };
        auto choices = run_choices(self->g_.engine, self->request_, callbacks);
        Result<TurnResult> r = unavailable("the turn did not run");
        std::vector<TurnResult> more;
        if (choices.ok()) {
            r = std::move(choices->front());
            more.assign(std::make_move_iterator(choices->begin() + 1),
                        std::make_move_iterator(choices->end()));
        } else {
            r = choices.status();
        }
        asio::post(self->socket_.get_executor(),
                   [self, r = std::move(r), more = std::move(more)]() mutable {
                       self->end_turn(std::move(r), std::move(more));
                   });
    });
    if (ticket == 0) {
        in_turn_ = false;
        g_.metrics.request_failed();
        return answer(error_answer(503, "the server is busy: every turn thread is taken and " +
                                            std::to_string(g_.options.max_queued_turns) +
                                            " requests wait; try again"));
    }
    wait_for_thread(ticket);
    watch_peer();
}

void Connection::wait_for_thread(uint64_t ticket) {
    queue_timer_.expires_after(std::chrono::milliseconds(g_.options.queue_timeout_ms));
    queue_timer_.async_wait([self = shared_from_this(), ticket](beast::error_code ec) {
        if (ec || self->closed_ || !self->g_.runner.cancel(ticket)) return;  // it started
        self->in_turn_ = false;
        self->g_.metrics.request_failed();
        self->answer(error_answer(503, "the server is busy: no turn thread was free within " +
                                           std::to_string(self->g_.options.queue_timeout_ms) +
                                           " ms; try again"));
    });
}

std::optional<std::vector<LogprobEntry>> Connection::take_logprobs() {
    if (request_.top_logprobs < 0) return std::nullopt;
    return std::exchange(pending_logprobs_, {});
}

bool Connection::on_piece(std::string_view piece) {
    return stream_chunk([&](bool first) {
        const auto logprobs = take_logprobs();
        if (completion_) {
            const std::string text = std::string(piece);
            const size_t offset = text_offset_;
            for (char c : text) text_offset_ += (static_cast<uint8_t>(c) & 0xc0) != 0x80;
            return text_completion_chunk_json(id_, created_, g_.engine.model_id(),
                                              (first && echo_ ? request_.prompt_text : "") + text,
                                              "", std::nullopt, logprobs ? &*logprobs : nullptr,
                                              offset);
        }
        return chunk_json(id_, created_, g_.engine.model_id(), std::string(piece), first, "",
                          std::nullopt, {}, logprobs ? &*logprobs : nullptr);
    });
}

bool Connection::on_tool_call(int index, const model::ToolCall& call) {
    // Named first, then its arguments, as OpenAI streams a call.
    for (int part = 0; part < 2; ++part) {
        const bool sent = stream_chunk([&](bool first) {
            return tool_call_chunk_json(id_, created_, g_.engine.model_id(), index, call, part,
                                        first);
        });
        if (!sent) return false;
    }
    return true;
}

bool Connection::stream_chunk(const std::function<std::string(bool first)>& chunk) {
    if (!alive_ || g_.cut) return false;
    if (!request_.stream) return true;
    if (unread_.load() > g_.options.max_unread_bytes) {
        spdlog::warn("gateway: a client left {} streamed bytes unread; dropping it",
                     unread_.load());
        close();
        return false;
    }
    std::string bytes;
    if (!head_sent_)
        bytes = format_sse_head(request_.session_id, stream_keep_alive_, allow_origin_);
    bytes += sse_event(chunk(!head_sent_));
    head_sent_ = true;
    asio::post(socket_.get_executor(), [self = shared_from_this(), b = std::move(bytes)]() mutable {
        self->send(std::move(b));
    });
    return true;
}

SessionAnswer Connection::session_answer(const TurnResult& r) const {
    // A turn that said nothing (cancelled before its answer) did not move the session.
    if (request_.session_id.empty() || r.session_turn == 0) return {};
    return {r.session_turn, r.session_stored};
}

void Connection::end_turn(Result<TurnResult> r, std::vector<TurnResult> more) {
    in_turn_ = false;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
    if (!r.ok() || !alive_) {
        g_.metrics.request_failed();
    } else {
        g_.metrics.request_done(*r, seconds);
        for (const TurnResult& c : more) g_.metrics.choice_done(c);
        if (g_.cut && r->finish_reason == "cancelled") r->finish_reason = "shutdown";
    }
    if (closed_ || !alive_) return abort();
    const std::string& model = g_.engine.model_id();
    if (!request_.stream || (!head_sent_ && !r.ok())) {
        if (!r.ok()) return answer(session_error(r.error(), !request_.session_id.empty()));
        // Each choice's answer (choice 0 with the prompt's scores), then as one.
        const auto whole = [&](const TurnResult& c, bool first) {
            if (completion_) {
                const std::string shown = (echo_ ? request_.prompt_text : "") + c.text;
                const PromptScores prompt{first ? &r->prompt_logprobs : nullptr, echoed_top_,
                                          listed_top_};
                return text_completion_json(id_, created_, model, shown, c.finish_reason, c.usage,
                                            request_.top_logprobs >= 0 ? &c.logprobs : nullptr, 0,
                                            prompt);
            }
            return completion_json(id_, created_, model, c.text, c.finish_reason, c.usage,
                                   request_.session_id, session_answer(c), c.tool_calls,
                                   request_.top_logprobs >= 0 ? &c.logprobs : nullptr);
        };
        std::vector<std::string> answers{whole(*r, true)};
        for (const TurnResult& c : more) answers.push_back(whole(c, false));
        HttpAnswer a{200, answers.size() == 1 ? answers[0] : merge_choices(answers)};
        if (completion_) return answer(a);
        a.session_id = request_.session_id;
        a.kv_source = r->usage.kv_source;
        return answer(a);
    }
    std::string tail =
        head_sent_ ? "" : format_sse_head(request_.session_id, stream_keep_alive_, allow_origin_);
    if (!r.ok()) {
        const HttpAnswer e = status_answer(r.error());
        tail += sse_event(error_json(r.error().message(), "server_error", e.status));
    } else {
        // The tokens whose text was held back or cut (a stop string) come with the end.
        auto logprobs = take_logprobs();
        if (logprobs && logprobs->empty()) logprobs.reset();
        if (completion_) {
            const std::string rest = !head_sent_ && echo_ ? request_.prompt_text : "";
            tail += sse_event(text_completion_chunk_json(
                id_, created_, model, rest, r->finish_reason, std::nullopt,
                logprobs ? &*logprobs : nullptr, text_offset_));
        } else {
            tail += sse_event(chunk_json(id_, created_, model,
                                         head_sent_ ? std::nullopt : std::optional<std::string>(""),
                                         !head_sent_, r->finish_reason, std::nullopt,
                                         session_answer(*r), logprobs ? &*logprobs : nullptr));
        }
        if (request_.include_usage) {
            tail += sse_event(
                completion_
                    ? text_completion_chunk_json(id_, created_, model, "", "", r->usage, nullptr, 0)
                    : chunk_json(id_, created_, model, std::nullopt, false, "", r->usage));
        }
    }
    tail += sse_event("[DONE]");
    tail += format_chunk("");
    const bool keep = stream_keep_alive_ && !draining_ && !g_.stopping;
    send(std::move(tail), keep ? Then::kRead : Then::kClose);
}

}  // namespace deltaserve::api
