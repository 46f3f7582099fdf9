// The OpenAI-compatible HTTP gateway (Boost.Beast, asynchronous): POST /v1/chat/completions
// (JSON or SSE stream), GET /v1/models, GET /health, GET /metrics (Prometheus text).
//
// Resources are bounded as nginx and Envoy bound them: a fixed set of I/O threads serves
// every connection; a connection limit; deadlines for a request's headers and body, for an
// idle keep-alive connection and for a client that stops reading; a cap on the bytes a slow
// reader may leave unread. Turns run on a bounded set of turn threads (the engine's
// run_turn blocks); beyond them requests queue, and beyond the queue they get 503 with
// Retry-After, as they do when no thread takes them within the queue timeout. A client that
// disconnects cancels its turn (streaming or not) at its next
// piece. stop() drains: no new connections, running turns get drain_timeout to finish.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "deltaserve/api/access.h"
#include "deltaserve/api/chat_engine.h"
#include "deltaserve/common/status.h"

namespace deltaserve::api {

struct GatewayOptions {
    std::string host = "127.0.0.1";
    uint16_t port = 8000;                 // 0: any free port (see HttpGateway::port)
    size_t max_body_bytes = 8u << 20;     // larger requests get 413. Default 8 MiB
    size_t max_header_bytes = 16u << 10;  // request line + headers; larger get 431. Default 16 KiB
    model::SamplingParams sampling;       // defaults for fields a request leaves out
    int32_t default_max_tokens = -1;      // for requests without max_tokens
    int io_threads = 2;                   // threads running every connection's I/O. Default 2
    int max_connections = 1024;           // beyond: 503 and close. Default 1024
    int max_running_turns = 64;           // turns generating at once (a thread each). Default 64
    int max_queued_turns = 256;           // waiting for a turn thread; beyond: 503. Default 256
    int64_t queue_timeout_ms = 30'000;    // a queued request waits this for a thread, then 503
    int64_t header_timeout_ms = 10'000;   // a request's line and headers arrive within this
    int64_t body_timeout_ms = 30'000;     // ... and its body within this after them
    int64_t idle_timeout_ms = 60'000;     // a keep-alive connection waits this for a request
    int64_t write_timeout_ms = 30'000;    // a client that reads nothing this long is dropped
    size_t max_unread_bytes = 4u << 20;   // streamed bytes a client may leave unread. Default 4 MiB
    // A stream's socket send buffer (SO_SNDBUF; Linux doubles it): small, so that a client
    // that stops reading fills the gateway's own buffer, where the write deadline and
    // max_unread_bytes see it, not megabytes of kernel buffer. Default 16 KiB
    int stream_send_buffer_bytes = 16 << 10;
    int64_t drain_timeout_ms = 30'000;  // stop(): running turns end by this, then are cut
    AccessOptions access;  // API keys for /v1/* (and /metrics when asked); none: loopback only
    // Host header values answered besides the loopback names and the bound address
    // ("name" with any port, "name:port", "*" any). Host is checked on a loopback address
    // without API keys, and whenever this is given (a DNS-rebinding page names its own
    // domain). Default: none (--allowed-host, repeatable).
    std::vector<std::string> allowed_hosts;
    // Origins (scheme://host[:port]) whose browser requests are served, CORS preflights
    // answered and Access-Control-Allow-Origin sent; "*" any. A request with another Origin
    // gets 403. Default: none (--allowed-origin, repeatable).
    std::vector<std::string> allowed_origins;
};

class HttpGateway {
  public:
    // Binds and starts accepting. Errors: kUnavailable when the address cannot be bound,
    // kInvalidArgument for an address that is not an IP or options out of range,
    // kFailedPrecondition for a non-loopback address without API keys (check_bind).
    static Result<std::unique_ptr<HttpGateway>> start(ChatEngine& engine,
                                                      const GatewayOptions& options);
    virtual ~HttpGateway() = default;
    virtual uint16_t port() const = 0;
    // Stops accepting and closes idle connections at once; running turns have
    // drain_timeout_ms to finish, then end with finish_reason "shutdown". Returns once every
    // connection and turn thread is gone. Safe to call twice.
    virtual void stop() = 0;
};

}  // namespace deltaserve::api
