// The cluster's nodes as etcd lists them (membership.h): a gateway's NodeSet that follows the
// members' table. A member that registers is connected (RpcClient, on a thread of the set's,
// not the watch's) and used once its RPC answers as a node of its role serving the gateway's
// model; one marked draining takes no new turn; one whose key goes (stopped, or its lease
// expired) is dropped and its connection closed, which ends its running turns with
// kUnavailable. Each name keeps one DecodeNode / PrefillNode object for the set's life, bound
// to whichever connection the member has now, so a session's pointer to its home stays valid
// across the member leaving and coming back.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "deltaserve/api/membership.h"
#include "deltaserve/api/node_set.h"
#include "deltaserve/api/rpc_client.h"

namespace deltaserve::api {

class MemberDecodeNode;
class MemberPrefillNode;

struct MemberNodesOptions {
    std::string prefix;    // the cluster's etcd prefix (ClusterConfig::etcd_prefix)
    std::string model_id;  // members serving another model are not used (logged)
    std::string cluster_token;
    std::chrono::milliseconds connect_wait{2000};  // one try at a member's RPC
    size_t max_members = 4096;  // names beyond this are not taken (an etcd that lists too many)
};

class MemberNodes final : public NodeSet {
  public:
    MemberNodes(EtcdClient& etcd, MemberNodesOptions options);
    ~MemberNodes() override;

    // Waits until etcd was read once and every member listed then was tried; false when
    // `limit` passed first (etcd not reachable: the set fills in as members come).
    bool wait_synced(std::chrono::milliseconds limit);

    std::vector<DecodeNode*> decode() const override;
    std::vector<PrefillNode*> prefill() const override;
    DecodeNode* decode_named(const std::string& name) const override;
    bool routable(const DecodeNode* node) const override;

    // Members connected and usable, by role (for the logs and tests).
    size_t usable_decode() const;
    size_t usable_prefill() const;
    const MemberTable& table() const { return *table_; }

  private:
    struct Slot;
    void on_change(const MemberChange& change);
    void connect_loop();
    // Connects `member` and binds its slot; false when it should be tried again.
    bool connect(const Member& member);

    const MemberNodesOptions options_;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::map<std::string, std::unique_ptr<Slot>> slots_;  // by "<role>/<name>"
    std::deque<Member> pending_;                          // to connect
    std::set<std::string> tried_;                         // slots the connector tried
    int connecting_ = 0;
    bool stop_ = false;
    std::thread connector_;
    std::unique_ptr<MemberTable> table_;  // last: its watch stops first
};

}  // namespace deltaserve::api
