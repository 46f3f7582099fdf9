// The OpenAI-compatible HTTP gateway (Boost.Beast): POST /v1/chat/completions (JSON or SSE
// stream), GET /v1/models, GET /health, GET /metrics (Prometheus text). One thread per
// connection, keep-alive; the engine behind it decides how turns share the model.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "deltaserve/api/chat_engine.h"
#include "deltaserve/common/status.h"

namespace deltaserve::api {

struct GatewayOptions {
    std::string host = "127.0.0.1";
    uint16_t port = 8000;              // 0: any free port (see HttpGateway::port)
    size_t max_body_bytes = 8u << 20;  // larger requests get 413
    model::SamplingParams sampling;    // defaults for fields a request leaves out
    int32_t default_max_tokens = -1;   // for requests without max_tokens
};

class HttpGateway {
  public:
    // Binds and starts accepting. Errors: kUnavailable when the address cannot be bound.
    static Result<std::unique_ptr<HttpGateway>> start(ChatEngine& engine,
                                                      const GatewayOptions& options);
    virtual ~HttpGateway() = default;
    virtual uint16_t port() const = 0;
    // Stops accepting, closes open connections, waits for their threads.
    virtual void stop() = 0;
};

}  // namespace deltaserve::api
