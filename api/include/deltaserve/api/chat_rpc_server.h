// The gateway's Cap'n Proto port (api/schema/chat.capnp): the chat service (sessions, turns
// streamed to a TokenSink the client hosts, cancel, close, info) and the admin service (engine
// stats, sessions), over the same ChatEngine as the HTTP gateway.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "deltaserve/api/access.h"
#include "deltaserve/api/chat_engine.h"
#include "deltaserve/common/status.h"
#include "deltaserve/model/sampler.h"

namespace deltaserve::api {

struct ChatRpcOptions {
    model::SamplingParams sampling;   // fields a send leaves at their defaults take these
    int32_t default_max_tokens = -1;  // for a send without maxTokens
    AccessOptions access;             // keys for Gateway.chat and Gateway.admin
    int max_running_sends = 64;       // sends running at once (a thread each). Default 64
    int max_queued_sends = 256;       // beyond them: RESOURCE_EXHAUSTED. Default 256
};

class ChatRpcServer {
  public:
    // Serves on "host:port" (port 0 picks one). The engine must outlive the server.
    // Errors: kUnavailable when the address cannot be bound.
    static Result<std::unique_ptr<ChatRpcServer>> start(const std::string& address,
                                                        ChatEngine& engine,
                                                        const ChatRpcOptions& options);
    virtual ~ChatRpcServer() = default;  // running turns finish first
    virtual uint16_t port() const = 0;
};

}  // namespace deltaserve::api
