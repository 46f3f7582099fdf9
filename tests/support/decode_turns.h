// What tests that run the decode worker share: a greedy turn, and a decode::TurnSink that keeps
// a turn's text and end.
#pragma once

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "deltaserve/decode/decode_worker.h"
#include "deltaserve/decode/turn.h"
#include "deltaserve/prefill/prefill_worker.h"

namespace deltaserve::testing {

// Turn `id` of `session` ("" = stateless): `tokens`, greedy, at most max_tokens answered.
inline decode::TurnSpec greedy_turn(uint64_t id, std::vector<int32_t> tokens,
                                    std::string session = "", int32_t max_tokens = 24) {
    decode::TurnSpec t;
    t.turn_id = id;
    t.session_id = std::move(session);
    t.tokens = std::move(tokens);
    t.sampling.temperature = 0;
    t.max_tokens = max_tokens;
    return t;
}

class CollectingSink : public decode::TurnSink {
  public:
    // cancel_after: on_piece returns false (the client left) at that piece; -1 = never.
    explicit CollectingSink(int cancel_after = -1) : cancel_after_(cancel_after) {}
    bool on_piece(std::string_view piece) override {
        text_ += piece;
        return ++pieces_ != cancel_after_;
    }
    void on_end(Result<decode::TurnEnd> end) override { done_.set_value(std::move(end)); }
    // The end, within 120 s (else kDeadlineExceeded).
    Result<decode::TurnEnd> wait() {
        auto f = done_.get_future();
        if (f.wait_for(std::chrono::seconds(120)) != std::future_status::ready) {
            return deadline_exceeded("the turn did not end");
        }
        return f.get();
    }
    const std::string& text() const { return text_; }

  private:
    int cancel_after_;
    int pieces_ = 0;
    std::string text_;
    std::promise<Result<decode::TurnEnd>> done_;
};

// A turn run to its end: how it ended (its text in end.text) and the worker's plan.
struct TurnRun {
    decode::TurnEnd end;
    decode::TurnPlan plan;
};

// Starts `spec` on `decode`, prefills it on `prefill` (connected to the decode worker at
// `address`) when the plan says so, and waits for its end.
inline Result<TurnRun> run_turn(decode::DecodeWorker& decode, prefill::PrefillWorker& prefill,
                                const std::string& address, const decode::TurnSpec& spec) {
    auto sink = std::make_shared<CollectingSink>();
    auto plan = decode.start_turn(spec, sink);
    if (!plan.ok()) return plan.status();
    if (plan->remote_prefill) {
        auto r = prefill.prefill({spec, address, plan->pull_tokens});
        if (!r.ok()) decode.cancel(spec.turn_id, r.status());
    }
    auto end = sink->wait();
    if (!end.ok()) return end.status();
    end->text = sink->text();
    return TurnRun{*end, *plan};
}

}  // namespace deltaserve::testing
