// The nodes a gateway runs turns on, whether in this process (the workers themselves) or in
// another (Cap'n Proto clients, rpc_client.h): the same calls either way.
#pragma once

#include <memory>
#include <string>

#include "deltaserve/api/version.h"
#include "deltaserve/common/status.h"
#include "deltaserve/decode/decode_worker.h"
#include "deltaserve/prefill/prefill_worker.h"

namespace deltaserve::api {

// Session ids a session_kv call takes at most (a page of an operator's listing).
constexpr size_t kMaxSessionKvIds = 1000;

class DecodeNode {
  public:
    virtual ~DecodeNode() = default;
    virtual std::string name() const = 0;
    // As DecodeWorker::start_turn; a lost node ends the turn with kUnavailable.
    virtual Result<decode::TurnPlan> start_turn(decode::TurnSpec spec,
                                                std::shared_ptr<decode::TurnSink> sink) = 0;
    virtual void cancel(uint64_t turn_id, Status why) = 0;
    virtual Result<decode::DecodeStats> stats() = 0;
    virtual void drop_session(const std::string& session_id) = 0;
    // As DecodeWorker::session_kv (at most kMaxSessionKvIds ids a call).
    virtual Result<std::vector<decode::SessionKv>> session_kv(
        const std::vector<std::string>& ids) = 0;
    // As DecodeWorker::checkpoint: the folder written, on the node's machine.
    virtual Result<std::string> checkpoint(const std::string& name) = 0;
    // As DecodeWorker::evict_session.
    virtual Status evict_session(const std::string& session_id) = 0;
    // As DecodeWorker::session_blocks and read_block.
    virtual Result<decode::SessionBlocks> session_blocks(const std::string& session_id) = 0;
    virtual Result<std::string> read_block(uint64_t key, uint64_t limit) = 0;
    // As DecodeWorker::pin_session.
    virtual Status pin_session(const std::string& session_id, bool pinned,
                               const std::string& scope) = 0;
    // Where prefill nodes ship this node's KV.
    virtual std::string data_address() const = 0;
    // Where the gateway reaches it ("in-process" for this process's worker), and its version.
    virtual std::string rpc_address() const { return "in-process"; }
    virtual std::string version() const { return deltaserve_version(); }
};

class PrefillNode {
  public:
    virtual ~PrefillNode() = default;
    virtual std::string name() const = 0;
    virtual Result<prefill::PrefillResult> prefill(const prefill::PrefillRequest& request) = 0;
    // Stops the turn's prefill, queued or running (PrefillWorker::cancel); best effort.
    virtual void cancel(uint64_t turn_id) = 0;
    virtual Result<prefill::PrefillStats> stats() = 0;
    virtual std::string rpc_address() const { return "in-process"; }
    virtual std::string version() const { return deltaserve_version(); }
};

// The workers of this process as nodes (they must outlive them).
std::unique_ptr<DecodeNode> local_decode_node(std::string name, decode::DecodeWorker& worker,
                                              std::string data_address);
std::unique_ptr<PrefillNode> local_prefill_node(std::string name, prefill::PrefillWorker& worker);

}  // namespace deltaserve::api
