// Cluster membership on etcd (DESIGN.md "Membership"): every process (gateway, prefill,
// decode) registers a MemberRecord under a lease it keeps alive (Registration); gateways
// follow the members' prefix (MemberTable) and so use a node within a second of its
// registering and drop it within its lease's TTL of its death.
//
// Keys: <prefix>members/<role>/<name>, the value the record's JSON. A record read from etcd is
// a peer's bytes: parse_member_record checks every field, and a key whose value does not
// parse is left out of the table (logged), never used.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "deltaserve/api/etcd_client.h"
#include "deltaserve/common/status.h"

namespace deltaserve::api {

enum class MemberRole { kGateway, kPrefill, kDecode };
const char* member_role_name(MemberRole role);

struct MemberRecord {
    MemberRole role = MemberRole::kDecode;
    std::string name;        // 1-64 of A-Z a-z 0-9 . _ -
    std::string rpc;         // host:port of its Cap'n Proto service ("": a gateway without)
    std::string data;        // decode: where prefill nodes ship KV; "" otherwise
    std::string http;        // gateway: host:port of its HTTP API; "" otherwise
    std::string model;       // what it serves (the model's identity); nodes of another are not used
    std::string kv;          // its KV identity (policy and profile fingerprint)
    std::string version;     // deltaserve's
    int32_t capacity = 0;    // turns at once (decode: max batch; prefill: queue)
    bool draining = false;   // takes no new turn; finishes its running ones
    int64_t started_ms = 0;  // when the process registered first (Unix ms)

    bool operator==(const MemberRecord&) const = default;
};

std::string encode_member_record(const MemberRecord& record);
// kInvalidArgument naming the field for anything but a record encode_member_record writes
// (unknown roles, names or addresses out of form, bytes that are not JSON).
Result<MemberRecord> parse_member_record(std::string_view value);

// The key of a member under `prefix` (which ends in '/').
std::string member_key(std::string_view prefix, MemberRole role, std::string_view name);

// Keeps one member's record in etcd under a lease of `ttl_seconds`, renewed every third of
// it from a thread of its own. While etcd cannot be reached it keeps trying; when the lease
// was lost (etcd was away longer than the TTL) it registers again under a new one. Another
// live member of the same role and name at another address is refused, never overwritten.
class Registration {
  public:
    // The first registration is tried before it returns: the status says how it went (a
    // name taken by another member is an error and no Registration); while etcd is away the
    // Registration is returned, unregistered, and keeps trying.
    static Result<std::unique_ptr<Registration>> start(EtcdClient& etcd, std::string prefix,
                                                       MemberRecord record, int64_t ttl_seconds);
    // Deletes its key (revokes the lease) and stops.
    ~Registration();
    Registration(const Registration&) = delete;
    Registration& operator=(const Registration&) = delete;

    // Writes the record changed (e.g. draining) under the same lease.
    Status update(MemberRecord record);
    // Stops keeping the lease alive and leaves the key to expire, as a process killed would.
    void abandon();

    bool registered() const { return registered_.load(); }
    int64_t lease() const { return lease_.load(); }
    // Leases it has registered under (1 while etcd never lost it).
    int64_t registrations() const { return registrations_.load(); }
    const std::string& key() const { return key_; }

  private:
    Registration(EtcdClient& etcd, std::string key, MemberRecord record, int64_t ttl_seconds);
    // One try at a new lease and the record under it.
    Status register_once();
    void run();

    EtcdClient& etcd_;
    const std::string key_;
    const int64_t ttl_seconds_;
    std::mutex mu_;  // record_, stop_ (with cv_)
    std::condition_variable cv_;
    MemberRecord record_;
    bool stop_ = false;
    std::atomic<bool> registered_{false};
    std::atomic<int64_t> lease_{0};
    std::atomic<int64_t> registrations_{0};
    std::thread thread_;
};

// A member as a gateway sees it: its record, its key's lease, and the revision that wrote it.
struct Member {
    MemberRecord record;
    int64_t lease = 0;
    int64_t mod_revision = 0;
};

struct MemberChange {
    enum Kind { kAdded, kChanged, kRemoved } kind;
    Member member;  // kRemoved: the member as it was last
};

// Every member under a prefix, kept from a watch (a snapshot, then events). Changes are
// found by value, not key alone: a member whose address changed is a kChanged, which the
// owner must act on (a new connection), not a key it already knows.
class MemberTable {
  public:
    // `on_change` runs on the watch's thread, one change at a time, under no lock of the
    // table's (it may call members()).
    MemberTable(EtcdClient& etcd, std::string prefix,
                std::function<void(const MemberChange&)> on_change = {});
    ~MemberTable();

    std::vector<Member> members() const;
    std::vector<Member> members(MemberRole role) const;
    // Whether the table has been read from etcd at least once, and whether its watch is open.
    bool synced() const { return synced_.load(); }
    bool connected() const;
    // Values under the prefix that did not parse (left out).
    int64_t rejected() const { return rejected_.load(); }

  private:
    void apply(const EtcdWatchUpdate& update);
    // A key's value parsed into `into`; false (counted, logged) when it does not.
    bool read(const EtcdKeyValue& kv, Member& into);

    const std::string root_;    // the cluster's prefix
    const std::string prefix_;  // root_ + "members/"
    const std::function<void(const MemberChange&)> on_change_;
    mutable std::mutex mu_;
    std::map<std::string, Member> members_;  // by key
    std::atomic<bool> synced_{false};
    std::atomic<int64_t> rejected_{0};
    std::unique_ptr<EtcdWatch> watch_;  // last: it stops before the rest goes
};

}  // namespace deltaserve::api
