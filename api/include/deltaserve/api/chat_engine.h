// What the gateway asks of the nodes behind it: one chat turn, streamed. ClusterChatEngine
// (cluster_chat_engine.h) runs it on prefill and decode workers.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "deltaserve/api/openai_protocol.h"

namespace deltaserve::api {

struct TurnResult {
    std::string text;
    std::string finish_reason;  // "stop" (end of turn or a stop string) or "length"
    Usage usage;
    double ttft_seconds = 0;  // request start to the first piece (or the end)
};

struct EngineStats {
    int64_t sessions = 0;
    int64_t queued = 0;            // turns waiting for the model
    int64_t kv_bytes = 0;          // held by the KV cache
    int64_t kv_bytes_shipped = 0;  // sent from prefill to decode workers
    double keep_ratio = 1.0;       // kv_bytes over the same tokens in fp16 full KV
    int64_t prefill_retries = 0;   // prefills tried again on another node after one was lost
};

struct SessionSummary {
    std::string id;
    int32_t messages = 0;  // in its history
    int64_t idle_seconds = 0;
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
    virtual std::vector<SessionSummary> sessions() const = 0;
    // Forgets a session: its history, and its KV wherever it is held. Unknown ids are ignored.
    virtual void forget_session(const std::string& id) = 0;
};

}  // namespace deltaserve::api
