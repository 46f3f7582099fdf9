// A client of etcd's v3 API, spoken through etcd's JSON gateway (`POST /v3/...` over HTTP/1.1,
// keys and values in base64, 64-bit integers as strings): what cluster membership and the
// gateways' shared session state stand on. The gateway rather than gRPC: it is the same v3
// API and etcd serves it on the client port, it needs no generated code of etcd's protos
// (which import gogoproto and google.api that Debian does not ship beside them) and no gRPC
// runtime with its own threads next to KJ's; Boost.Beast already carries our HTTP. Watches and
// lease keep-alives are streams of JSON objects over one response (api/README.md).
//
// Every call is thread-safe and blocking, bounded by EtcdOptions::timeout per endpoint. A call
// whose endpoint cannot be reached (or answers Unavailable) goes to the next endpoint; an
// answer (a refusal, a missing lease) is returned as it is. etcd's answers are read as
// hostile bytes: a malformed one is an error naming what is wrong, never a crash.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "deltaserve/common/status.h"

namespace deltaserve::api {

struct EtcdOptions {
    std::vector<std::string> endpoints;  // "host:port", or "http://host:port" as etcdctl takes
    std::string user;                    // etcd's authentication; empty: none
    std::string password;
    std::chrono::milliseconds timeout{2000};      // one call on one endpoint
    std::chrono::milliseconds watch_idle{10000};  // a watch with no byte for this long reconnects
};

// Splits "a:2379,b:2379" (DELTASERVE_ETCD's form) into endpoints.
std::vector<std::string> split_etcd_endpoints(std::string_view list);

struct EtcdKeyValue {
    std::string key;
    std::string value;
    int64_t create_revision = 0;
    int64_t mod_revision = 0;
    int64_t version = 0;
    int64_t lease = 0;
};

struct EtcdRange {
    std::vector<EtcdKeyValue> kvs;
    int64_t revision = 0;  // the store's revision the range was read at
};

// A compare-and-swap's outcome: whether it wrote, the revision after, and the key as it is
// when it did not (absent: mod_revision 0).
struct EtcdSwap {
    bool done = false;
    int64_t revision = 0;
    EtcdKeyValue current;
};

struct EtcdEvent {
    bool deleted = false;
    EtcdKeyValue kv;  // a deletion carries the key and its mod_revision only
};

// What a watch delivers: a snapshot (every key under the prefix, at `revision`: first, and again
// after a gap the store compacted away) or the events that followed the last delivery.
struct EtcdWatchUpdate {
    bool snapshot = false;
    std::vector<EtcdKeyValue> kvs;  // snapshot
    std::vector<EtcdEvent> events;  // otherwise
    int64_t revision = 0;
};

class EtcdWatch;

class EtcdClient {
  public:
    // Checks the options (endpoints present and of the form host:port); connects on first use.
    static Result<std::unique_ptr<EtcdClient>> create(EtcdOptions options);
    ~EtcdClient();
    EtcdClient(const EtcdClient&) = delete;
    EtcdClient& operator=(const EtcdClient&) = delete;

    const EtcdOptions& options() const { return options_; }

    Result<EtcdRange> get(std::string_view key);
    Result<EtcdRange> get_prefix(std::string_view prefix);
    // The revision after the write.
    Result<int64_t> put(std::string_view key, std::string_view value, int64_t lease = 0);
    // How many keys went.
    Result<int64_t> erase(std::string_view key);
    Result<int64_t> erase_prefix(std::string_view prefix);
    // Writes only if the key's mod_revision is `expected` (0: only if the key is absent).
    Result<EtcdSwap> put_if(std::string_view key, std::string_view value, int64_t expected,
                            int64_t lease = 0);
    // Deletes only if the key's mod_revision is `expected`.
    Result<EtcdSwap> erase_if(std::string_view key, int64_t expected);

    // A lease of `ttl_seconds`: its id.
    Result<int64_t> grant_lease(int64_t ttl_seconds);
    // Renews a lease: its TTL again; not_found once it has expired or was revoked.
    Result<int64_t> keep_alive(int64_t lease);
    Status revoke_lease(int64_t lease);
    // Seconds the lease has left; not_found once it has expired.
    Result<int64_t> lease_time_left(int64_t lease);

    // Watches every key under `prefix` on a thread of its own: a snapshot first, then events,
    // resumed without a gap across reconnections and endpoints. `on_update` runs on that
    // thread; it must not destroy the watch.
    Result<std::unique_ptr<EtcdWatch>> watch_prefix(
        std::string prefix, std::function<void(const EtcdWatchUpdate&)> on_update);

    // The POST of one gateway call: the answer's body, or the error etcd gave (its gRPC code
    // mapped to a StatusCode) or why no endpoint answered. Re-authenticates once when the
    // token was refused. Public for the watch; callers use the calls above.
    Result<std::string> call(std::string_view path, const std::string& body);
    // The endpoint calls go to first (the last one that answered) and a token for it.
    size_t current_endpoint() const { return current_.load(); }
    Result<std::string> token();
    void forget_token(const std::string& refused);

  private:
    explicit EtcdClient(EtcdOptions options);

    EtcdOptions options_;
    std::atomic<size_t> current_{0};
    std::mutex token_mu_;
    std::string token_;  // empty: none yet (or no authentication)
};

// A running watch (EtcdClient::watch_prefix). Destroying it stops its thread: at once while
// it streams or waits, within the client's timeout per endpoint while it reads a snapshot.
class EtcdWatch {
  public:
    EtcdWatch(EtcdClient& client, std::string prefix,
              std::function<void(const EtcdWatchUpdate&)> on_update);
    ~EtcdWatch();
    EtcdWatch(const EtcdWatch&) = delete;
    EtcdWatch& operator=(const EtcdWatch&) = delete;

    // Whether its stream is open now (false while etcd cannot be reached).
    bool connected() const { return connected_.load(); }
    // The revision delivered last.
    int64_t revision() const { return revision_.load(); }
    // Streams it has opened (1 while nothing went wrong).
    int64_t streams() const { return streams_.load(); }

  private:
    void run();
    // One stream from next_ on; returns when it ends. Sets resync_ when the store compacted
    // past next_.
    void follow_stream();

    EtcdClient& client_;
    const std::string prefix_;
    const std::function<void(const EtcdWatchUpdate&)> on_update_;
    std::atomic<bool> stop_{false};
    std::atomic<bool> connected_{false};
    std::atomic<int64_t> revision_{0};
    std::atomic<int64_t> streams_{0};
    int64_t next_ = 0;
    bool resync_ = true;
    size_t failures_ = 0;  // streams that did not open since the last that did
    std::mutex cancel_mu_;
    std::function<void()> cancel_;  // closes the open stream
    std::thread thread_;
};

}  // namespace deltaserve::api
