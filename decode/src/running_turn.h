// A turn inside the decode worker: waiting for its KV, or generating in the worker's loop.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "deltaserve/decode/text_stream.h"
#include "deltaserve/decode/turn.h"
#include "deltaserve/model/inference_context.h"
#include "deltaserve/model/model.h"
#include "deltaserve/model/sampler.h"
#include "deltaserve/model/token_constraint.h"

namespace deltaserve::decode {

struct Turn {
    enum class Stage { kPrefillHere, kAwaitKv, kRunning, kEnded };

    Turn(TurnSpec s, std::shared_ptr<TurnSink> k, const model::Model& m)
        : spec(std::move(s)),
          sink(std::move(k)),
          model(m),
          sampler(spec.sampling),
          scan(spec.stop) {
        for (int32_t t : spec.tokens) sampler.accept(t);
        prev = spec.tokens.back();
    }

    // A continued turn (TurnSpec::continued): start_turn takes its answer so far off the
    // prompt into `forced`, and the turn takes those tokens as its first generated ones, one
    // decode step each, as the node that generated them did, so their KV and the logits after
    // them are the same: their draws skipped, their text not sent again (the client has its
    // first `sent_before` bytes), no token or log-probabilities reported for them.
    std::deque<int32_t> forced;
    size_t sent_before = 0;
    // Takes the next forced token, if any.
    bool take_forced() {
        if (forced.empty()) return false;
        sampler.skip_sample();
        const int32_t token = forced.front();
        forced.pop_front();
        take(token, nullptr, true);
        return true;
    }

    // The first token: sampled from the prefill's logits here, or the one the prefill node
    // sampled (the random stream skips the draw it took there).
    void admit_local(std::span<const float> logits) {
        if (spec.max_tokens == 0) return stop_with("length");
        take_from(logits);
    }
    void admit_remote() {
        if (spec.max_tokens == 0) return stop_with("length");
        if (take_forced()) return;  // the prefill node's draw was the forced token's
        sampler.skip_sample();
        take(first_token, first_logprobs ? &*first_logprobs : nullptr);
    }
    // The next token from a row of logits: among those the constraint allows, if any.
    int32_t pick(std::span<const float> logits) {
        if (constraint == nullptr) return sampler.sample(logits);
        return sampler.sample(logits, constraint->allowed());
    }
    // The next token from a row, with its log-probabilities when the spec asks for them.
    void take_from(std::span<const float> logits) {
        if (take_forced()) return;
        const int32_t token = pick(logits);
        if (spec.logprobs < 0 || token < 0) return take(token);
        const model::TokenLogprobs lp = model::token_logprobs(logits, token, spec.logprobs);
        take(token, &lp);
    }
    // A turn whose answer is constrained, or that reports log-probabilities, takes the whole
    // row (not a device's top-k).
    bool wants_whole_row() const { return constraint != nullptr || spec.logprobs >= 0; }
    // A generated token: streams its text, then either ends the turn (done) or leaves the
    // token in next_token for the next forward pass.
    void take(int32_t token, const model::TokenLogprobs* lp = nullptr, bool was_forced = false) {
        const model::Tokenizer& tok = *model.tokenizer;
        if (constraint != nullptr && !constraint->accept(token)) {
            // No token continues the grammar (the vocabulary lacks the bytes), or a prefill
            // node's first token does not: the answer would break the format.
            return fail(
                internal_error("constrained decoding: no token of the vocabulary can "
                               "continue the response format here"));
        }
        // The end-of-turn token has its log-probabilities too (as vLLM reports it): what
        // scoring a prompt needs when the model would end there.
        if (lp != nullptr) sink->on_logprobs(*lp);
        if (tok.is_eog(token)) return stop_with("stop");
        ++end.completion_tokens;
        sampler.accept_generated(token);
        if (!was_forced) sink->on_token(token);
        const bool shown = std::find(spec.shown_tokens.begin(), spec.shown_tokens.end(), token) !=
                           spec.shown_tokens.end();
        const bool stopped = scan.add(tok.token_to_piece(token, prev, shown));
        prev = token;
        std::string_view piece = scan.release(stopped);
        const size_t had = std::min(sent_before, piece.size());  // a continued turn's, sent
        piece.remove_prefix(had);
        sent_before -= had;
        if (!piece.empty() && !sink->on_piece(piece)) return stop_with("cancelled");
        if (stopped || (constraint != nullptr && constraint->must_end())) {
            return stop_with("stop");
        }
        if (spec.max_tokens >= 0 && end.completion_tokens >= spec.max_tokens)
            return stop_with("length");
        next_token = token;
    }
    Result<TurnEnd> finish(const std::string& reason) {
        if (reason != "cancelled") {
            std::string_view rest = scan.release(true);
            rest.remove_prefix(std::min(sent_before, rest.size()));
            if (!rest.empty()) sink->on_piece(rest);
        }
        end.finish_reason = reason;
        end.text = scan.text();
        return end;
    }
    Status failure_status() {
        std::lock_guard<std::mutex> lock(mu);
        return failure;
    }

    const TurnSpec spec;
    const std::shared_ptr<TurnSink> sink;
    const model::Model& model;
    std::atomic<Stage> stage{Stage::kAwaitKv};
    std::atomic<bool> failed{false};            // ends at the loop's next look
    std::atomic<bool> cancel_requested{false};  // ... as "cancelled"
    bool reported = false;                      // the sink heard the end (under the worker's lock)
    // KV bytes booked for it (under the worker's lock; DecodeOptions::kv_memory), and the part
    // of them only its prefill holds (given back when the prompt is in).
    size_t booked = 0, prefill_booked = 0;

    // Guarded by mu: the KV arriving for it (and the session's history a prefill node pulls).
    std::mutex mu;
    Status failure;
    std::unique_ptr<model::InferenceContext> history, incoming;
    std::vector<int32_t> covered;  // tokens of each layer imported so far
    // The connection whose stream fills `incoming`: a stream begun over another one (the
    // gateway retrying the prefill on another node) replaces it, and the first one's late
    // messages are ignored.
    const transport::Connection* kv_from = nullptr;
    std::atomic<bool> admissible{false};
    int32_t first_token = -1;
    std::optional<model::TokenLogprobs> first_logprobs;  // the prefill node's, when asked
    // Waiting for its KV, it fails past this: kv_wait_ms from its start, then from each
    // message of its stream (a long prompt streaming its rows stays alive).
    std::atomic<std::chrono::steady_clock::time_point> kv_deadline{};

    // Owned by the worker's loop once the turn runs.
    std::unique_ptr<model::InferenceContext> ctx;
    std::vector<int32_t> cached;  // the tokens in ctx
    int32_t prefilled = 0;        // prompt tokens in ctx (while prefilling here)
    bool in_loop = false;         // the loop took it up
    uint64_t arrival = 0;         // start_turn's count: prompts prefill here in this order
    // Its prompt may be found in the prefix cache when its first chunk comes (another turn
    // may have computed it meanwhile): a turn with no KV of its own.
    bool look_again = false;
    model::Sampler sampler;
    // The response format's constraint (spec.json_schema), made by the worker; null for free
    // text.
    std::unique_ptr<model::TokenConstraint> constraint;
    StopScanner scan;
    int32_t prev = -1;
    int32_t next_token = -1;
    bool done = false;
    std::string finish_reason;
    TurnEnd end;

  private:
    void fail(Status why) {
        std::lock_guard<std::mutex> lock(mu);
        failure = std::move(why);
        failed = true;
    }
    void stop_with(const char* reason) {
        done = true;
        finish_reason = reason;
    }
};

}  // namespace deltaserve::decode
