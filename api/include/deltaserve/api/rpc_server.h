// Serves a node's roles to gateways over Cap'n Proto RPC (api/schema/cluster.capnp): the
// decode worker as a DecodeNode (turns started by the gateway, their text streamed back to a
// TokenSink the gateway hosts), the prefill worker as a PrefillNode. The RPC runs on an
// event-loop thread of its own; long calls (a prefill) run on threads of their own.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "deltaserve/common/status.h"
#include "deltaserve/decode/decode_worker.h"
#include "deltaserve/prefill/prefill_worker.h"

namespace deltaserve::api {

struct NodeRoles {
    std::string name;      // the node's name in the cluster config
    std::string model_id;  // what it serves
    decode::DecodeWorker* decode = nullptr;
    std::string data_address;  // where the decode worker takes KV
    prefill::PrefillWorker* prefill = nullptr;
};

class RpcServer {
  public:
    // Listens on "host:port" (port 0 picks one). The workers must outlive the server.
    // Errors: kUnavailable when the address cannot be bound.
    // cluster_token: the secret a caller proves before it reaches the node ("" = none: any
    // caller proves the empty secret; nodes then belong on the loopback address).
    static Result<std::unique_ptr<RpcServer>> start(const std::string& address, NodeRoles roles,
                                                    const std::string& cluster_token = "");
    virtual ~RpcServer() = default;  // stops serving; running prefills finish first
    virtual uint16_t port() const = 0;
};

}  // namespace deltaserve::api
