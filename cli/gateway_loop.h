// What `serve` and `gateway` do once their engine runs: the HTTP gateway, the Cap'n Proto chat
// service when asked for, a line saying where they listen, then serving until SIGINT/SIGTERM.
#pragma once

#include <signal.h>

#include <functional>
#include <string>

#include "deltaserve/api/chat_engine.h"
#include "deltaserve/api/http_gateway.h"

namespace deltaserve::cli {

// rpc_address: "host:port" of the chat service, "" for none. `serving` ends the ready line
// ("deltaserve: serving M on http://H:P<serving>"). `on_serving` runs once the HTTP port is
// bound (its port), `on_stop` when a stop signal comes, before the gateway stops (a cluster
// gateway's registration in etcd). Returns the exit code.
int serve_gateway(api::ChatEngine& engine, const api::GatewayOptions& options,
                  const std::string& rpc_address, const std::string& serving,
                  const sigset_t& stop_signals,
                  const std::function<Status(uint16_t port)>& on_serving = {},
                  const std::function<void()>& on_stop = {});

}  // namespace deltaserve::cli
