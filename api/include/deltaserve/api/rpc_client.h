// A gateway's connection to a node in another process (Cap'n Proto RPC, cluster.capnp): its
// roles as DecodeNode / PrefillNode (cluster_nodes.h). Calls block the caller; the RPC runs
// on an event-loop thread of its own. A node that dies or becomes unreachable turns its calls
// into kUnavailable and ends its turns with that error; the client reconnects on the next
// call.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "deltaserve/api/cluster_nodes.h"
#include "deltaserve/common/status.h"

namespace deltaserve::api {

struct NodeInfo {
    std::string role;  // "decode", "prefill" or "decode+prefill"
    std::string name;
    std::string model_id;
    std::string version;  // its deltaserve version
};

class RpcClient {
  public:
    // Connects to a node's RPC address and asks what it is, retrying until `wait` has passed
    // (nodes of a cluster start in any order). Errors: kUnavailable.
    // cluster_token: proved to the node (a node with another refuses: kUnauthenticated,
    // without waiting further).
    static Result<std::unique_ptr<RpcClient>> connect(const std::string& address,
                                                      std::chrono::milliseconds wait,
                                                      const std::string& cluster_token = "");
    virtual ~RpcClient() = default;
    virtual const NodeInfo& info() const = 0;
    // The node's roles; kFailedPrecondition when it does not have that role. The nodes live
    // as long as the client.
    virtual Result<DecodeNode*> decode_node() = 0;
    virtual Result<PrefillNode*> prefill_node() = 0;
};

}  // namespace deltaserve::api
