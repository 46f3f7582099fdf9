#include "deltaserve/api/access.h"

#include "deltaserve/common/args.h"

#include <arpa/inet.h>
#include <openssl/sha.h>

#include <algorithm>
#include <cstdio>

namespace deltaserve::api {

namespace {

// The first 8 bytes of SHA-256(key) in hex: names a tenant in session ids and logs without
// revealing the key.
std::string tenant_tag(std::string_view key) {
    unsigned char digest[SHA256_DIGEST_LENGTH];
    SHA256(reinterpret_cast<const unsigned char*>(key.data()), key.size(), digest);
    std::string tag = "t";
    char hex[3];
    for (int i = 0; i < 8; ++i) {
        std::snprintf(hex, sizeof hex, "%02x", digest[i]);
        tag += hex;
    }
    return tag;
}

// SHA-256 of a key: keys are compared as digests, so the time a comparison takes says
// nothing of a key's length or of how much of it a guess got right.
std::string key_digest(std::string_view key) {
    std::string digest(SHA256_DIGEST_LENGTH, '\0');
    SHA256(reinterpret_cast<const unsigned char*>(key.data()), key.size(),
           reinterpret_cast<unsigned char*>(digest.data()));
    return digest;
}

// Index of the digest equal to key's among `digests` (each compared, whatever matches), or -1.
int find_key(const std::vector<std::string>& digests, std::string_view key) {
    const std::string d = key_digest(key);
    int found = -1;
    for (size_t i = 0; i < digests.size(); ++i) {
        const bool equal = constant_time_equal(d, digests[i]);
        found = equal && found < 0 ? static_cast<int>(i) : found;
    }
    return found;
}

}  // namespace

std::optional<std::string_view> bearer_key(std::string_view authorization) {
    constexpr std::string_view kBearer = "bearer";
    if (authorization.size() <= kBearer.size() + 1 ||
        !std::equal(
            kBearer.begin(), kBearer.end(), authorization.begin(),
            [](char a, char b) { return a == std::tolower(static_cast<unsigned char>(b)); }) ||
        authorization[kBearer.size()] != ' ') {
        return std::nullopt;
    }
    std::string_view key = authorization.substr(kBearer.size());
    while (!key.empty() && key.front() == ' ') key.remove_prefix(1);
    if (key.empty()) return std::nullopt;
    return key;
}

bool constant_time_equal(std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    unsigned char diff = 0;
    for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
    return diff == 0;
}

Status check_key(std::string_view key) {
    const bool printable = std::all_of(key.begin(), key.end(), [](char c) {
        return static_cast<unsigned char>(c) > 0x20 && static_cast<unsigned char>(c) < 0x7f;
    });
    if (key.empty() || !printable) {
        return invalid_argument("an API key must be non-empty printable ASCII without spaces");
    }
    return Status();
}

std::vector<std::string> split_keys(std::string_view list) { return split_comma_list(list); }

AccessControl::AccessControl(AccessOptions options) : options_(std::move(options)) {
    for (const std::string& k : options_.api_keys) {
        tags_.push_back(tenant_tag(k));
        digests_.push_back(key_digest(k));
    }
    for (const std::string& k : options_.admin_keys) admin_digests_.push_back(key_digest(k));
}

Result<std::string> AccessControl::tenant(std::string_view key) const {
    if (!enabled()) return std::string();
    const int found = key.empty() ? -1 : find_key(digests_, key);
    if (found < 0) {
        return Status(StatusCode::kUnauthenticated,
                      key.empty() ? "an API key is required (Authorization: Bearer KEY)"
                                  : "the API key is not valid");
    }
    return tags_[static_cast<size_t>(found)];
}

Result<std::string> AccessControl::tenant_of_header(std::string_view authorization) const {
    if (!enabled()) return std::string();
    if (!authorization.empty() && !bearer_key(authorization)) {
        return Status(StatusCode::kUnauthenticated,
                      "the Authorization header must be 'Bearer KEY' (the scheme in any case)");
    }
    return tenant(bearer_key(authorization).value_or(std::string_view()));
}

bool AccessControl::admin(std::string_view key) const {
    if (options_.admin_keys.empty()) return !enabled();
    return !key.empty() && find_key(admin_digests_, key) >= 0;
}

namespace {

bool is_loopback(const std::string& host) {
    in_addr v4{};
    in6_addr v6{};
    return (inet_pton(AF_INET, host.c_str(), &v4) == 1 && (ntohl(v4.s_addr) >> 24) == 127) ||
           (inet_pton(AF_INET6, host.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6)) ||
           host == "localhost";
}

}  // namespace

Status check_cluster_bind(const std::string& address, const std::string& cluster_token,
                          bool insecure) {
    if (!cluster_token.empty() || insecure) return Status();
    std::string host = address.substr(0, address.rfind(':'));
    if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
    if (is_loopback(host)) return Status();
    return failed_precondition(
        "refusing to serve " + address +
        " without a cluster token: any peer that reaches it could start, replace or pull "
        "turns. Set cluster_token (or DELTASERVE_CLUSTER_TOKEN) in every node's and gateway's "
        "config, or insecure: true to serve it open anyway");
}

Status check_bind(const std::string& host, const AccessOptions& options) {
    if (!options.api_keys.empty() || options.insecure) return Status();
    if (is_loopback(host)) return Status();
    return failed_precondition(
        "refusing to serve " + host +
        " without an API key: anyone who reaches it could read every conversation. Set "
        "--api-key (or DELTASERVE_API_KEY), or pass --insecure to serve it open anyway");
}

}  // namespace deltaserve::api
