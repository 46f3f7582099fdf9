// The gateway's side of a chat turn (DESIGN.md "One chat turn", steps 2-5): renders the
// conversation with the model's chat template, tokenizes it, starts the turn on the session's
// decode worker and, when that worker asks for it, has the least-loaded prefill worker compute
// the prompt's KV and ship it there (another prefill worker if that one is lost on the way);
// then streams the decode worker's text to the client.
//
// `deltaserve serve` runs one of each worker in its process over the in-process transport.
// Sessions keep their messages here (the decode worker keeps their KV); a turn sends only
// its new messages. With a record store (--data-dir), each session's record (its messages,
// turns and counts) is written when it opens and when a turn completes, and read back when
// the engine starts: sessions outlive a restart (a turn that was running is lost).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "deltaserve/api/chat_engine.h"
#include "deltaserve/api/cluster_nodes.h"
#include "deltaserve/api/node_set.h"
#include "deltaserve/kvstore/disk_tier.h"
#include "deltaserve/model/model.h"

namespace deltaserve::api {

class PrefillWatch;
class SessionQuota;

struct ClusterEngineOptions {
    // Idle sessions are forgotten beyond this, least recent first (with a record store they
    // leave memory only, and come back from it when named).
    int32_t max_sessions = 64;
    int64_t session_ttl_seconds = 3600;  // idle sessions are forgotten after this
    // Where sessions' records are kept across restarts (the disk tier's records, under
    // "gw/"), or null: sessions live in memory only.
    std::shared_ptr<kvstore::DiskTier> records;
    // With a record store: the sessions it keeps, in all and per tenant (opening one more is
    // 429 too_many_sessions: refused rather than evicting one, as a stored session is a
    // user's conversation and idle ones already leave after session_ttl_seconds), and the
    // bytes of their records (their conversations: a tenant's turn is 429 once its
    // sessions' records, or all of them, hold that much). Default 10000 sessions and 1 GiB,
    // per tenant the same (lower them to share a server between keys).
    int64_t max_stored_sessions = 10000, max_stored_sessions_per_tenant = 10000;
    int64_t max_stored_bytes = int64_t{1} << 30, max_stored_bytes_per_tenant = int64_t{1} << 30;
    // checkpoint(): where the records store's copy goes, ROOT/checkpoints/<name>/STORE/kv;
    // STORE "" when the records live in a decode worker's store (serve), copied with it.
    std::string checkpoint_root, records_store;
    // A turn whose decode node is lost mid-answer goes on on another node, at most this many
    // times (0 = it ends with the node's error).
    int32_t max_turn_moves = 2;
};

class ClusterChatEngine : public ChatEngine {
  public:
    // The nodes must outlive the engine; at least one decode node.
    ClusterChatEngine(const model::Model& model, std::string model_id,
                      std::vector<DecodeNode*> decode, std::vector<PrefillNode*> prefill,
                      ClusterEngineOptions options);
    // The nodes as a set that changes (member_nodes.h: the members etcd lists).
    ClusterChatEngine(const model::Model& model, std::string model_id,
                      std::shared_ptr<NodeSet> nodes, ClusterEngineOptions options);
    ~ClusterChatEngine() override;
    std::string model_id() const override { return model_id_; }
    const model::Model& model() const override { return model_; }
    // Errors besides the workers': kNotFound for a session that is not open,
    // kFailedPrecondition when the session has a turn running.
    Result<TurnResult> run_turn(const ChatRequest& request,
                                const TurnCallbacks& callbacks) override;
    EngineStats stats() const override;
    // Sessions read back from the record store at start, and the time that took.
    int64_t sessions_recovered() const { return recovered_; }
    double recovery_ms() const { return recovery_ms_; }
    Result<SessionInfo> open_session(const std::string& tenant, const std::string& id) override;
    Result<SessionInfo> session_info(const std::string& tenant,
                                     const std::string& id) const override;
    Status close_session(const std::string& tenant, const std::string& id) override;
    std::vector<SessionInfo> sessions() const override;
    SessionList tenant_sessions(const std::string& tenant, const std::string& after,
                                int32_t limit) const override;
    SessionPage session_page(const std::string& after, int32_t limit) const override;
    std::vector<NodeStats> node_stats() const override;
    ClusterView cluster() const override;
    Result<std::vector<std::string>> checkpoint(const std::string& name) const override;
    Status evict_session(const std::string& tenant, const std::string& id) override;
    Status pin_session(const std::string& tenant, const std::string& id, bool pinned) override;
    Result<decode::SessionBlocks> session_blocks(const std::string& tenant, const std::string& id,
                                                 std::string* node) override;
    Result<std::string> read_block(const std::string& node, uint64_t key, uint64_t limit) override;

  private:
    // A text completion's prompt (ChatRequest::raw_prompt) as ids.
    Result<std::vector<int32_t>> prompt_tokens(const ChatRequest& request) const;
    struct Session {
        std::string tenant, id;
        std::vector<model::ChatMessage> history;
        int64_t last_used = 0;
        DecodeNode* node = nullptr;  // where its KV is
        int32_t turns = 0;
        int64_t tokens = 0, cached_tokens = 0;
        uint64_t running_turn = 0;  // 0: none
        bool pinned = false;        // kept in memory (pin_session)
        // Its record came through a repair of a store that could not be trusted (deltactl
        // repair): it may be older than what its client saw, so its turns wait for the
        // client's expected_turn.
        bool history_lost = false;
        mutable bool stored = true;  // the last save() of its record went to disk
    };
    // The map's key (and the decode nodes' session id): tenant and id, which cannot clash.
    static std::string key_of(const std::string& tenant, const std::string& id) {
        return tenant + "/" + id;
    }
    SessionInfo info_of(const Session& s, int64_t now) const;
    // A turn's expected_turn against the session (under mu_): kDataLoss for a session whose
    // history was marked lost and a request that does not name its turn (cleared when it
    // does), kAborted for a request expecting another turn.
    Status check_expected_turn(Session& s, const ChatRequest& request) const;
    // Why `tenant` may not open one more session, or may not store more bytes (`opening`
    // false), or OK. Expired records are swept first when a cap is reached.
    Status room_for(const std::string& tenant, bool opening);
    void sweep_expired_locked();
    DecodeNode* least_loaded_decode(const DecodeNode* except) const;
    PrefillNode* least_loaded_prefill(const std::vector<PrefillNode*>& except) const;
    // Has the least-loaded prefill node compute the turn's KV for `node`; when a prefill
    // node is lost on the way (kUnavailable), the next one, each node once. The decode node
    // takes the KV stream of the last try.
    Status prefill_turn(const decode::TurnSpec& spec, DecodeNode& node, int32_t pull_tokens);
    // Forgets idle sessions past the TTL or beyond max_sessions (least recent first); their
    // KV is dropped from their nodes after the lock (dropped is filled under it).
    void forget_stale(int64_t now, std::vector<std::pair<DecodeNode*, std::string>>& dropped);
    // Idle sessions leave memory, least recently used first, until one more fits: forgotten
    // (into dropped), or, with a record store, only out of memory (they stay stored). Under mu_.
    void make_room_locked(std::vector<std::pair<DecodeNode*, std::string>>& dropped);
    void drop(const std::vector<std::pair<DecodeNode*, std::string>>& dropped);
    // The record store (options.records): a session's record written, or removed. A failed
    // write is logged; the session goes on in memory.
    // Writes the session's record (synced); false when the store failed (logged).
    bool save(const Session& s) const;
    void unsave(const std::string& key) const;
    void recover();
    // A stored record parsed (nullopt: it does not parse, or names another key).
    std::optional<Session> parse_record(const std::string& key, const std::string& value) const;
    // The session's stored record, when it has one and it has not expired. Under mu_.
    std::optional<Session> stored_locked(const std::string& key) const;
    // The session in memory, or read back from the record store into memory; null when
    // neither holds it. Under mu_.
    Session* find_locked(const std::string& key);

    const model::Model& model_;
    std::vector<int32_t> tool_tokens_;  // the control tokens of the model's tool calls
    const std::string model_id_;
    const std::shared_ptr<NodeSet> nodes_;
    const ClusterEngineOptions options_;
    std::atomic<int64_t> prefill_retries_{0};
    std::atomic<int64_t> turn_moves_{0};
    std::thread repin_;  // the stored pins taken again at start (joined in the destructor)
    // The turns waiting on a prefill node (prefill_watch.h).
    std::unique_ptr<PrefillWatch> watch_;
    mutable std::mutex mu_;
    std::map<std::string, Session> sessions_;
    std::unique_ptr<SessionQuota> quota_;  // the record store's use against its caps
    int64_t recovered_ = 0;
    double recovery_ms_ = 0;
};

}  // namespace deltaserve::api
