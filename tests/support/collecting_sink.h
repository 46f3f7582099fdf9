// A decode::TurnSink that keeps a turn's text and end, for tests that run the decode worker.
#pragma once

#include <chrono>
#include <future>
#include <string>
#include <string_view>

#include "deltaserve/decode/turn.h"

namespace deltaserve::testing {

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

}  // namespace deltaserve::testing
