// The gateway's counters, rendered in Prometheus text format for GET /metrics.
#pragma once

#include <atomic>
#include <map>
#include <mutex>
#include <string>

#include "deltaserve/api/chat_engine.h"

namespace deltaserve::api {

class Metrics {
  public:
    void request_done(const TurnResult& t, double seconds);
    // Another choice of a request with n > 1 (ChatRequest::n): its prompt, cached and
    // generated tokens count as choice 0's do; requests and latencies are choice 0's.
    void choice_done(const TurnResult& t);
    void request_failed();
    std::string render(const EngineStats& engine) const;

    // The gateway's connections: open now, refused at the limit, dropped at a deadline.
    void connection_opened() { ++connections_; }
    void connection_closed() { --connections_; }
    void connection_refused() { ++refused_; }
    void deadline_missed() { ++timeouts_; }
    int64_t connections() const { return connections_.load(); }

  private:
    mutable std::mutex mu_;
    int64_t requests_ = 0, failed_ = 0, prompt_tokens_ = 0, cached_tokens_ = 0, generated_ = 0;
    // Cached prompt tokens by where their KV came from (Usage::kv_source).
    std::map<std::string, int64_t> cached_by_source_;
    double ttft_sum_ = 0, duration_sum_ = 0, itl_sum_ = 0;
    int64_t itl_count_ = 0;
    std::atomic<int64_t> connections_{0}, refused_{0}, timeouts_{0};
};

}  // namespace deltaserve::api
