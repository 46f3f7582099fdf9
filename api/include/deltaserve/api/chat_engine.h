// What the gateway asks of the node behind it: one chat turn, streamed. The embedded engine
// runs the model in-process (deltaserve serve); the cluster roles will implement the same
// interface over RPC.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "deltaserve/api/openai_protocol.h"
#include "deltaserve/model/inference_context.h"
#include "deltaserve/model/model.h"

namespace deltaserve::api {

struct TurnResult {
    std::string text;
    std::string finish_reason;  // "stop" (end of turn or a stop string) or "length"
    Usage usage;
    double ttft_seconds = 0;  // request start to the first piece (or the end)
};

struct EngineStats {
    int64_t sessions = 0;
    int64_t queued = 0;       // turns waiting for the model
    int64_t kv_bytes = 0;     // held by the KV cache
    double keep_ratio = 1.0;  // kv_bytes over the same tokens in fp16 full KV
};

class ChatEngine {
  public:
    virtual ~ChatEngine() = default;
    virtual std::string model_id() const = 0;
    // Runs one turn: the messages are the conversation's new ones when session_id names a
    // known session, else the whole conversation. on_piece gets each piece of text (whole
    // UTF-8 characters, stop strings held back) and returns false to cancel the turn.
    virtual Result<TurnResult> run_turn(const ChatRequest& request,
                                        const std::function<bool(std::string_view)>& on_piece) = 0;
    virtual EngineStats stats() const = 0;
};

struct EmbeddedOptions {
    int32_t max_sessions = 64;           // least recently used sessions are forgotten beyond this
    int64_t session_ttl_seconds = 3600;  // idle sessions are forgotten after this
};

// The model in this process, one turn at a time (later turns queue). A session's history
// is kept between turns; while the KV cache holds that session, a new turn evaluates only
// its new tokens (the rest of the prompt is the cached prefix).
class EmbeddedChatEngine : public ChatEngine {
  public:
    EmbeddedChatEngine(std::unique_ptr<model::Model> model,
                       std::unique_ptr<model::InferenceContext> ctx, std::string model_id,
                       EmbeddedOptions options);
    std::string model_id() const override { return model_id_; }
    Result<TurnResult> run_turn(const ChatRequest& request,
                                const std::function<bool(std::string_view)>& on_piece) override;
    EngineStats stats() const override;

  private:
    struct Session {
        std::vector<model::ChatMessage> history;
        int64_t last_used = 0;
    };
    Result<TurnResult> generate(const ChatRequest& request,
                                const std::vector<model::ChatMessage>& conversation,
                                const std::function<bool(std::string_view)>& on_piece);
    void forget_stale(int64_t now);

    std::unique_ptr<model::Model> model_;
    std::unique_ptr<model::InferenceContext> ctx_;
    std::string model_id_;
    EmbeddedOptions options_;
    std::mutex mu_;                // one turn at a time
    std::vector<int32_t> cached_;  // the tokens in the KV cache, in order
    std::map<std::string, Session> sessions_;
    std::atomic<int64_t> queued_{0};
    // What stats() reports, updated after each turn so that it never waits for one.
    std::atomic<int64_t> n_sessions_{0}, kv_bytes_{0};
    std::atomic<double> keep_ratio_{1.0};
};

}  // namespace deltaserve::api
