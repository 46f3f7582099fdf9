#include "deltaserve/api/etcd_client.h"

#include "deltaserve/common/logging.h"
#include "etcd_http.h"
#include "etcd_json.h"

namespace deltaserve::api {

std::vector<std::string> split_etcd_endpoints(std::string_view list) {
    std::vector<std::string> out;
    size_t start = 0;
    while (start <= list.size()) {
        const size_t comma = std::min(list.find(',', start), list.size());
        std::string_view part = list.substr(start, comma - start);
        while (!part.empty() && part.front() == ' ') part.remove_prefix(1);
        while (!part.empty() && part.back() == ' ') part.remove_suffix(1);
        if (!part.empty()) out.emplace_back(part);
        start = comma + 1;
    }
    return out;
}

Result<std::unique_ptr<EtcdClient>> EtcdClient::create(EtcdOptions options) {
    if (options.endpoints.empty()) return invalid_argument("etcd: no endpoint given");
    for (const std::string& e : options.endpoints) {
        DS_RETURN_IF_ERROR(etcd::parse_endpoint(e).status());
    }
    if (options.user.empty() != options.password.empty()) {
        return invalid_argument("etcd: a user needs a password, and a password a user");
    }
    if (options.timeout.count() <= 0 || options.watch_idle.count() <= 0) {
        return invalid_argument("etcd: the timeouts must be positive");
    }
    return std::unique_ptr<EtcdClient>(new EtcdClient(std::move(options)));
}

EtcdClient::EtcdClient(EtcdOptions options) : options_(std::move(options)) {}
EtcdClient::~EtcdClient() = default;

Result<std::string> EtcdClient::token() {
    if (options_.user.empty()) return std::string();
    {
        std::lock_guard<std::mutex> lock(token_mu_);
        if (!token_.empty()) return token_;
    }
    const std::string body = etcd::authenticate_request(options_.user, options_.password);
    Status last = unavailable("etcd: no endpoint");
    const size_t n = options_.endpoints.size();
    for (size_t k = 0; k < n; ++k) {
        const size_t i = (current_.load() + k) % n;
        const etcd::Endpoint e = etcd::parse_endpoint(options_.endpoints[i]).value();
        Result<etcd::Answer> a = etcd::post(e, "/v3/auth/authenticate", body, "", options_.timeout);
        if (!a.ok()) {
            last = a.error();
            continue;
        }
        if (a->status != 200) {
            last = etcd::error_of(a->status, a->body);
            if (last.code() == StatusCode::kUnavailable) continue;
            return last.with_context("etcd authentication as '" + options_.user + "'");
        }
        DS_ASSIGN_OR_RETURN(std::string t, etcd::parse_token(a->body));
        current_.store(i);
        std::lock_guard<std::mutex> lock(token_mu_);
        token_ = t;
        return t;
    }
    return last;
}

void EtcdClient::forget_token(const std::string& refused) {
    std::lock_guard<std::mutex> lock(token_mu_);
    if (token_ == refused) token_.clear();
}

Result<std::string> EtcdClient::call(std::string_view path, const std::string& body) {
    Status last = unavailable("etcd: no endpoint");
    bool reauthenticated = false;
    const size_t n = options_.endpoints.size();
    for (size_t k = 0; k < n; ++k) {
        const size_t i = (current_.load() + k) % n;
        DS_ASSIGN_OR_RETURN(std::string tok, token());
        const etcd::Endpoint e = etcd::parse_endpoint(options_.endpoints[i]).value();
        Result<etcd::Answer> a = etcd::post(e, path, body, tok, options_.timeout);
        if (!a.ok()) {
            last = a.error();
            continue;
        }
        if (a->status == 200) {
            current_.store(i);
            return std::move(a->body);
        }
        last = etcd::error_of(a->status, a->body);
        if (!tok.empty() && !reauthenticated && etcd::is_token_refused(last)) {
            forget_token(tok);
            reauthenticated = true;
            --k;  // the same endpoint again, with a new token
            continue;
        }
        // An endpoint that cannot serve (no leader, shutting down): the next one may.
        if (last.code() == StatusCode::kUnavailable) continue;
        return last;
    }
    return last;
}

Result<EtcdRange> EtcdClient::get(std::string_view key) {
    DS_ASSIGN_OR_RETURN(std::string a, call("/v3/kv/range", etcd::range_request(key, "")));
    return etcd::parse_range(a);
}

Result<EtcdRange> EtcdClient::get_prefix(std::string_view prefix) {
    DS_ASSIGN_OR_RETURN(
        std::string a, call("/v3/kv/range", etcd::range_request(prefix, etcd::prefix_end(prefix))));
    return etcd::parse_range(a);
}

Result<int64_t> EtcdClient::put(std::string_view key, std::string_view value, int64_t lease) {
    DS_ASSIGN_OR_RETURN(std::string a, call("/v3/kv/put", etcd::put_request(key, value, lease)));
    return etcd::parse_revision(a);
}

Result<int64_t> EtcdClient::erase(std::string_view key) {
    DS_ASSIGN_OR_RETURN(std::string a, call("/v3/kv/deleterange", etcd::delete_request(key, "")));
    return etcd::parse_deleted(a);
}

Result<int64_t> EtcdClient::erase_prefix(std::string_view prefix) {
    DS_ASSIGN_OR_RETURN(
        std::string a,
        call("/v3/kv/deleterange", etcd::delete_request(prefix, etcd::prefix_end(prefix))));
    return etcd::parse_deleted(a);
}

Result<EtcdSwap> EtcdClient::put_if(std::string_view key, std::string_view value, int64_t expected,
                                    int64_t lease) {
    DS_ASSIGN_OR_RETURN(std::string a,
                        call("/v3/kv/txn", etcd::swap_request(key, expected, true, value, lease)));
    return etcd::parse_swap(a);
}

Result<EtcdSwap> EtcdClient::erase_if(std::string_view key, int64_t expected) {
    DS_ASSIGN_OR_RETURN(std::string a,
                        call("/v3/kv/txn", etcd::swap_request(key, expected, false, "", 0)));
    return etcd::parse_swap(a);
}

Result<int64_t> EtcdClient::grant_lease(int64_t ttl_seconds) {
    if (ttl_seconds < 1) return invalid_argument("etcd: a lease lives at least 1 s");
    DS_ASSIGN_OR_RETURN(std::string a, call("/v3/lease/grant", etcd::grant_request(ttl_seconds)));
    return etcd::parse_lease_id(a);
}

Result<int64_t> EtcdClient::keep_alive(int64_t lease) {
    DS_ASSIGN_OR_RETURN(std::string a, call("/v3/lease/keepalive", etcd::lease_request(lease)));
    return etcd::parse_keep_alive(a);
}

Status EtcdClient::revoke_lease(int64_t lease) {
    Result<std::string> a = call("/v3/lease/revoke", etcd::lease_request(lease));
    if (!a.ok()) return a.error();
    return etcd::parse_revision(*a).status();
}

Result<int64_t> EtcdClient::lease_time_left(int64_t lease) {
    DS_ASSIGN_OR_RETURN(std::string a, call("/v3/lease/timetolive", etcd::lease_request(lease)));
    return etcd::parse_time_left(a);
}

Result<std::unique_ptr<EtcdWatch>> EtcdClient::watch_prefix(
    std::string prefix, std::function<void(const EtcdWatchUpdate&)> on_update) {
    return std::make_unique<EtcdWatch>(*this, std::move(prefix), std::move(on_update));
}

}  // namespace deltaserve::api
