// What the gateway asks of the nodes behind it: one chat turn, streamed. ClusterChatEngine
// (cluster_chat_engine.h) runs it on prefill and decode workers.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "deltaserve/api/openai_protocol.h"
#include "deltaserve/common/status.h"
#include "deltaserve/decode/decode_worker.h"
#include "deltaserve/decode/tier_stats.h"
#include "deltaserve/model/model.h"
#include "deltaserve/prefill/prefill_worker.h"

namespace deltaserve::api {

struct TurnResult {
    std::string text;  // the answer's text, less its tool calls
    // "stop" (end of turn or a stop string), "length", or "tool_calls" (it ended after
    // calling tools)
    std::string finish_reason;
    std::vector<model::ToolCall> tool_calls;  // each with the id the gateway gave it
    std::vector<LogprobEntry> logprobs;       // each answer token's, when asked for
    // ChatRequest::prompt_logprobs: every prompt token's (the first unscored), when asked for.
    std::vector<LogprobEntry> prompt_logprobs;
    Usage usage;
    double ttft_seconds = 0;  // request start to the first piece (or the end)
    int32_t turn_moves = 0;   // decode nodes it moved to after one was lost mid-answer
    // A session's turn: whether its record (the conversation with this answer) is on disk,
    // synced, before the answer (false: the record store failed; the session goes on in
    // memory and may not survive a restart). True without a record store or a session.
    bool session_stored = true;
    int32_t session_turn = 0;  // the session's turns after this one (its next expected_turn)
};

struct EngineStats {
    int64_t sessions = 0;
    int64_t queued = 0;              // turns waiting for the model
    int64_t kv_bytes = 0;            // held by the KV cache
    int64_t prefix_cache_bytes = 0;  // held for later prompts that start the same way
    int64_t kv_sessions = 0;         // sessions whose KV the decode workers hold
    int64_t kv_memory = 0;           // the decode workers' KV budgets (--kv-memory)
    int64_t kv_booked = 0;           // ... booked by their turns
    int64_t kv_pool_used = 0;        // their block pools' bytes in use (full KV)
    int64_t kv_bytes_shipped = 0;    // sent from prefill to decode workers
    int64_t prefill_tokens = 0;      // prompt tokens the prefill workers computed to the end
    double keep_ratio = 1.0;         // kv_bytes over the same tokens in fp16 full KV
    int64_t prefill_retries = 0;     // prefills tried again on another node after one was lost
    int64_t turn_moves = 0;          // turns moved to another decode node mid-answer
    decode::TierStats tiers;         // the decode nodes' tiered stores, summed
    // Sessions the gateway read back from its records at start, and the time it took.
    int64_t sessions_recovered = 0;
    double sessions_recovery_ms = 0.0;
};

// A chat session as its owner sees it.
struct SessionInfo {
    std::string id;      // the name its owner gave it, or the one the server made
    std::string tenant;  // the key's tag (AccessControl::tenant); "" without keys
    int32_t turns = 0;
    int32_t messages = 0;       // in its history
    int64_t tokens = 0;         // in its KV after the last turn (prompt and answer)
    int64_t cached_tokens = 0;  // of the last turn's prompt, found in its KV
    int64_t idle_seconds = 0;
    bool running = false;       // a turn is running
    bool stored = true;         // its record is on disk as it is now (see TurnResult)
    bool history_lost = false;  // recovered by a repair: its turns wait for expected_turn
};

// One session as an operator sees it (the admin service's pages, deltactl sessions): what
// the gateway knows, and where its KV is on its decode node.
struct SessionRow {
    std::string key;  // tenant/id: the pages' order
    SessionInfo info;
    std::string node;  // its decode node ("" none yet)
    int64_t last_use_unix = 0;
    int64_t ttl_left_seconds = -1;  // until it is forgotten when idle
    bool in_memory = true;          // false: only its record holds it (out of the gateway's memory)
    decode::SessionKv kv;           // kv.id "" where its node was not asked or did not answer
};

struct SessionPage {
    std::vector<SessionRow> rows;
    std::string next;  // the key to ask after for the next page; "" at the end
};

// A decode node's stats as the admin service shows them (its tiers), or why not.
struct NodeStats {
    std::string name, rpc_address, data_address, version;
    Status status;
    decode::DecodeStats stats;
};

struct PrefillNodeStats {
    std::string name, rpc_address, version;
    Status status;
    prefill::PrefillStats stats;
};

// The cluster as deltactl cluster shows it: the gateway's version and model, and its nodes.
struct ClusterView {
    std::string version, model_id;
    std::vector<NodeStats> decode;
    std::vector<PrefillNodeStats> prefill;
};

// What a turn's caller gives it. on_piece gets each piece of text (whole UTF-8 characters,
// stop strings held back, and with tools what may be a tool call) and returns false to cancel
// the turn; on_tool_call (may be empty) each tool call as it completes, with its index in
// the answer. wanted (empty: always) is
// asked while the turn waits for its next piece, every kWantedPollMs at most apart: a prompt
// that queues or prefills for minutes is cancelled as soon as it returns false (a client
// that left, a server whose drain ran out), its KV freed then, not at its first piece.
struct TurnCallbacks {
    static constexpr int kWantedPollMs = 100;
    std::function<bool(std::string_view)> on_piece;
    std::function<bool(int, const model::ToolCall&)> on_tool_call;
    // Each answer token's log-probabilities (ChatRequest::top_logprobs), before the piece
    // that holds its text; may be empty.
    std::function<void(const LogprobEntry&)> on_logprobs;
    // The prompt's KV is in (decode::TurnSink::on_prompt_done): a request's other choices
    // can start and share it; may be empty.
    std::function<void()> on_prompt_done;
    std::function<bool()> wanted;
};

constexpr int32_t kMaxSessionPage = 1000;

class ChatEngine {
  public:
    virtual ~ChatEngine() = default;
    virtual std::string model_id() const = 0;
    // The served model as the gateway holds it (its tokenizer and chat template: /tokenize).
    virtual const model::Model& model() const = 0;
    // Runs one turn: with a session_id, the messages are the session's new ones (the
    // session must be open and belong to request.tenant: else kNotFound); without, the whole
    // conversation. A turn the caller cancels (TurnCallbacks) ends with finish_reason
    // "cancelled".
    virtual Result<TurnResult> run_turn(const ChatRequest& request,
                                        const TurnCallbacks& callbacks) = 0;
    virtual EngineStats stats() const = 0;

    // Sessions are opened explicitly and belong to the tenant that opened them: to another
    // tenant they do not exist (kNotFound), and two tenants may use the same name.
    // open_session: id "" makes an unguessable id. Errors: kInvalidArgument (the id breaks
    // check_session_id's rules), kAlreadyExists, kResourceExhausted (the session table is
    // full of running sessions; idle ones are forgotten, least recently used first).
    virtual Result<SessionInfo> open_session(const std::string& tenant, const std::string& id) = 0;
    virtual Result<SessionInfo> session_info(const std::string& tenant,
                                             const std::string& id) const = 0;
    // Forgets a session: its history, and its KV wherever it is held; a running turn ends.
    // Errors: kNotFound.
    virtual Status close_session(const std::string& tenant, const std::string& id) = 0;
    // Every tenant's sessions (the admin service).
    virtual std::vector<SessionInfo> sessions() const = 0;
    // One page of a tenant's sessions (GET /v1/sessions), in id order: those whose id sorts
    // after `after` ("" from the first), `limit` at most (1..kMaxSessionPage), and whether
    // more follow.
    struct SessionList {
        std::vector<SessionInfo> data;
        bool more = false;
    };
    virtual SessionList tenant_sessions(const std::string& tenant, const std::string& after,
                                        int32_t limit) const = 0;
    // The sessions after key `after` ("" from the first), in key order, `limit` at most
    // (1..kMaxSessionPage), with where their KV is: each node asked once for the page, and
    // the gateway's lock held only to copy the page's rows.
    virtual SessionPage session_page(const std::string& after, int32_t limit) const = 0;
    virtual std::vector<NodeStats> node_stats() const = 0;
    virtual ClusterView cluster() const = 0;
    // A copy of every store (each decode node's and the gateway's records') for the tools, in
    // the data dir's layout under <data dir>/checkpoints/<name>: the folders written.
    // Errors: the first node's that failed (the others' copies stay).
    virtual Result<std::vector<std::string>> checkpoint(const std::string& name) const = 0;
    // An idle session's KV out of decode memory into the tiers, on its node (an operator's
    // evict). Errors: kNotFound (no such session, or none of its KV in decode memory),
    // kFailedPrecondition (a turn runs for it).
    virtual Status evict_session(const std::string& tenant, const std::string& id) = 0;
    // Keeps a session in memory (the gateway's and its KV in its node's decode memory) until
    // unpinned, evicted or dropped (DecodeWorker::pin_session). The pin is stored with the
    // session's record: a restarted server takes its KV back into memory as it starts.
    virtual Status pin_session(const std::string& tenant, const std::string& id, bool pinned) = 0;
    // The session's stored record on its node and where each block is (tiers, leases), for
    // deltactl session describe: `node` is set to the node's name. Errors: kNotFound.
    virtual Result<decode::SessionBlocks> session_blocks(const std::string& tenant,
                                                         const std::string& id,
                                                         std::string* node) = 0;
    // A stored block's first `limit` bytes (0: all) on the decode node named `node`.
    // Errors: kNotFound (no such node or block), kUnavailable.
    virtual Result<std::string> read_block(const std::string& node, uint64_t key,
                                           uint64_t limit) = 0;
};

}  // namespace deltaserve::api
