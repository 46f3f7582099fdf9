// What the gateway's record store holds of sessions, against its caps
// (ClusterEngineOptions::max_stored_*): the sessions and the bytes of their records, in all
// and by tenant. Counted from the records at start and kept as they are written and removed.
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

namespace deltaserve::api {

class SessionQuota {
  public:
    struct Caps {
        int64_t sessions = 0, sessions_per_tenant = 0, bytes = 0, bytes_per_tenant = 0;
    };
    explicit SessionQuota(Caps caps) : caps_(caps) {}

    // A session's record of `bytes` was written (again) under `key`.
    void recorded(const std::string& key, const std::string& tenant, int64_t bytes);
    // Its record was removed.
    void removed(const std::string& key);
    // Why `tenant` may not open one more session (`opening`) or store more bytes, naming the
    // cap and its flag; "" when it may.
    std::string refusal(const std::string& tenant, bool opening) const;

  private:
    struct Use {
        int64_t sessions = 0, bytes = 0;
    };
    const Caps caps_;
    mutable std::mutex mu_;
    Use total_;
    std::map<std::string, Use> by_tenant_;
    std::unordered_map<std::string, std::pair<std::string, int64_t>>
        records_;  // key: tenant, bytes
};

}  // namespace deltaserve::api
