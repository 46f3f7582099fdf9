// What the gateway's connections share: the engine, the options, the metrics, the turn
// threads, the registry of open connections and the drain flags.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "deltaserve/api/chat_engine.h"
#include "deltaserve/api/http_gateway.h"
#include "http_rules.h"
#include "metrics.h"
#include "turn_runner.h"

namespace deltaserve::api {

class Connection;

struct GatewayCore {
    GatewayCore(ChatEngine& e, const GatewayOptions& o)
        : engine(e),
          options(o),
          access(o.access),
          rules(o),
          runner(o.max_running_turns, o.max_queued_turns) {}

    ChatEngine& engine;
    const GatewayOptions options;
    const AccessControl access;
    const RequestRules rules;
    Metrics metrics;
    std::atomic<bool> stopping{false};  // no new requests
    std::atomic<bool> cut{false};       // draining ran out of time: running turns end now
    std::mutex mu;
    std::unordered_map<Connection*, std::weak_ptr<Connection>> connections;
    TurnRunner runner;  // last: its threads hold connections; they stop first
};

}  // namespace deltaserve::api
