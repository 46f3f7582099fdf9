// The admin service of a running server, for deltactl's live views: `deltaserve serve
// --rpc-port N`, or a cluster's gateway (gateway.rpc), over Cap'n Proto with an admin key
// (api/schema/chat.capnp: Gateway.admin -> Admin). Calls block until answered; a server that
// is gone or refuses the key is an error naming it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "deltaserve/api/chat_engine.h"
#include "deltaserve/common/status.h"

namespace deltaserve::ops {

class LiveAdmin {
  public:
    // host_port: HOST:PORT. Errors: kInvalidArgument (not HOST:PORT), kUnavailable (no
    // server answers there), kUnauthenticated (the key is refused).
    static Result<std::unique_ptr<LiveAdmin>> connect(const std::string& host_port,
                                                      const std::string& admin_key);
    ~LiveAdmin();

    // Every session, a page of `page_size` at a time.
    Result<std::vector<api::SessionRow>> sessions(int32_t page_size);
    Result<std::vector<api::NodeStats>> nodes();
    Result<api::ClusterView> cluster();
    // The folders the checkpoint was written to (on the server's machines).
    Result<std::vector<std::string>> checkpoint(const std::string& name);
    // An operator's acts on one session (Admin.dropSession / evictSession).
    Status drop(const std::string& tenant, const std::string& id);
    Status evict(const std::string& tenant, const std::string& id);
    Status pin(const std::string& tenant, const std::string& id, bool pinned);
    // The session's stored record on its node and where each block is (`node`: its name).
    Result<decode::SessionBlocks> session_blocks(const std::string& tenant, const std::string& id,
                                                 std::string* node);
    // A stored block's first `limit` bytes (0: all) on a decode node.
    Result<std::vector<uint8_t>> read_block(const std::string& node, uint64_t key,
                                            uint64_t limit = 0);

  private:
    template <typename Request>
    Status act(Request req, const std::string& tenant, const std::string& id);

    struct Impl;
    explicit LiveAdmin(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace deltaserve::ops
