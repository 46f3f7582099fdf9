// Who may use the service (DESIGN.md "One chat turn", step 2): API keys as vLLM's --api-key
// (several allowed), each a tenant whose sessions no other key sees; admin keys for the
// admin service; and the rule that a server without keys serves the loopback address only.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "deltaserve/common/status.h"

namespace deltaserve::api {

struct AccessOptions {
    // Keys that may chat (`Authorization: Bearer KEY` on /v1/*, the chat RPC's apiKey).
    // Empty: no authentication. Default: none (--api-key, DELTASERVE_API_KEY, comma-separated).
    std::vector<std::string> api_keys;
    // Keys for the admin service (stats, every tenant's sessions). Default: none, and then the
    // admin service is open only where chat is (no keys at all). --admin-key.
    std::vector<std::string> admin_keys;
    bool metrics_need_key = false;  // GET /metrics needs a chat or admin key. Default: open
    bool insecure = false;          // allows binding a non-loopback address without keys
};

class AccessControl {
  public:
    explicit AccessControl(AccessOptions options);

    bool enabled() const { return !options_.api_keys.empty(); }
    const AccessOptions& options() const { return options_; }

    // The tenant a key belongs to: a tag derived from the key (never the key itself), "" when
    // the server has no keys. Errors: kUnauthenticated for a missing or unknown key. Keys are
    // compared as SHA-256 digests, each in constant time, every key each time.
    Result<std::string> tenant(std::string_view key) const;
    // The same for an HTTP Authorization header's value ("Bearer KEY", bearer_key);
    // kUnauthenticated naming the form for a value in another.
    Result<std::string> tenant_of_header(std::string_view authorization) const;
    // Whether key opens the admin service: an admin key, or anything when no key is set.
    bool admin(std::string_view key) const;

  private:
    AccessOptions options_;
    std::vector<std::string> tags_;     // tags_[i] is api_keys[i]'s tenant
    std::vector<std::string> digests_;  // SHA-256 of api_keys[i]: what a key is compared with
    std::vector<std::string> admin_digests_;
};

// kInvalidArgument for an empty key or one with characters outside printable ASCII.
Status check_key(std::string_view key);
// Splits "k1,k2" (an environment variable's form) into keys, dropping empty ones.
std::vector<std::string> split_keys(std::string_view list);
// Refuses (kFailedPrecondition) to bind `host` when it is not a loopback address and there
// are no API keys, unless options.insecure.
Status check_bind(const std::string& host, const AccessOptions& options);
// The same rule for a node's RPC or data address ("host:port", "[v6]:port") without a
// cluster token.
Status check_cluster_bind(const std::string& address, const std::string& cluster_token,
                          bool insecure);
// The key of an Authorization header's value "Bearer KEY": the scheme matched
// case-insensitively (RFC 7235 §2.1), one or more spaces, a non-empty key; nullopt for
// anything else.
std::optional<std::string_view> bearer_key(std::string_view authorization);
// Equal strings, in time that depends on their lengths only.
bool constant_time_equal(std::string_view a, std::string_view b);

}  // namespace deltaserve::api
