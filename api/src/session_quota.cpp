#include "session_quota.h"

namespace deltaserve::api {

void SessionQuota::recorded(const std::string& key, const std::string& tenant, int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    auto [it, fresh] = records_.try_emplace(key, tenant, 0);
    Use& t = by_tenant_[tenant];
    if (fresh) {
        ++t.sessions;
        ++total_.sessions;
    }
    t.bytes += bytes - it->second.second;
    total_.bytes += bytes - it->second.second;
    it->second.second = bytes;
}

void SessionQuota::removed(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = records_.find(key);
    if (it == records_.end()) return;
    Use& t = by_tenant_[it->second.first];
    --t.sessions;
    --total_.sessions;
    t.bytes -= it->second.second;
    total_.bytes -= it->second.second;
    if (t.sessions == 0) by_tenant_.erase(it->second.first);
    records_.erase(it);
}

std::string SessionQuota::refusal(const std::string& tenant, bool opening) const {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = by_tenant_.find(tenant);
    const Use t = it == by_tenant_.end() ? Use{} : it->second;
    const auto says = [](const char* whose, int64_t n, const char* what, const char* flag,
                         int64_t cap) {
        return std::string(whose) + " stored sessions: " + std::to_string(n) + " " + what +
               " reach the cap " + flag + " " + std::to_string(cap);
    };
    if (opening && t.sessions >= caps_.sessions_per_tenant)
        return says("this key's", t.sessions, "sessions", "--max-stored-sessions-per-tenant",
                    caps_.sessions_per_tenant);
    if (opening && total_.sessions >= caps_.sessions)
        return says("the server's", total_.sessions, "sessions", "--max-stored-sessions",
                    caps_.sessions);
    if (t.bytes >= caps_.bytes_per_tenant)
        return says("this key's", t.bytes, "bytes of conversation", "--max-stored-bytes-per-tenant",
                    caps_.bytes_per_tenant);
    if (total_.bytes >= caps_.bytes)
        return says("the server's", total_.bytes, "bytes of conversation", "--max-stored-bytes",
                    caps_.bytes);
    return {};
}

}  // namespace deltaserve::api
