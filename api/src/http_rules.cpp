#include "http_rules.h"

#include <arpa/inet.h>

#include <algorithm>

namespace deltaserve::api {

namespace beast = boost::beast;
namespace http = beast::http;

namespace {

std::string lower(std::string_view s) {
    std::string out(s);
    for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
}

bool iequals(std::string_view a, std::string_view b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
               return std::tolower(static_cast<unsigned char>(x)) ==
                      std::tolower(static_cast<unsigned char>(y));
           });
}

std::string_view trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
}

std::string_view value_of(const RequestHead& req, http::field f) {
    const auto it = req.find(f);
    if (it == req.end()) return {};
    return {it->value().data(), it->value().size()};
}

bool is_loopback_address(const std::string& host) {
    in_addr v4{};
    in6_addr v6{};
    return (inet_pton(AF_INET, host.c_str(), &v4) == 1 && (ntohl(v4.s_addr) >> 24) == 127) ||
           (inet_pton(AF_INET6, host.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6));
}

// A Host value's name and port ("" when it has none): "name", "name:port", "[v6]:port".
// False for one that does not parse.
bool split_host(std::string_view host, std::string_view& name, std::string_view& port) {
    size_t colon = std::string_view::npos;
    if (!host.empty() && host.front() == '[') {
        const size_t close = host.find(']');
        if (close == std::string_view::npos) return false;
        if (close + 1 < host.size()) {
            if (host[close + 1] != ':') return false;
            colon = close + 1;
        }
    } else {
        colon = host.find(':');
        if (colon != std::string_view::npos && host.find(':', colon + 1) != std::string_view::npos)
            return false;  // an IPv6 address without brackets
    }
    name = host.substr(0, colon);
    port = colon == std::string_view::npos ? std::string_view() : host.substr(colon + 1);
    return !name.empty() &&
           std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; });
}

bool is_json(std::string_view content_type) {
    const std::string_view media = trim(content_type.substr(0, content_type.find(';')));
    return iequals(media, "application/json");
}

HttpAnswer refuse(int status, const std::string& message) { return error_answer(status, message); }

}  // namespace

Result<RequestTarget> parse_target(std::string_view target) {
    RequestTarget t;
    std::string_view rest = target;
    for (const std::string_view scheme : {"http://", "https://"}) {
        if (rest.size() < scheme.size() || !iequals(rest.substr(0, scheme.size()), scheme))
            continue;
        rest.remove_prefix(scheme.size());
        const size_t end = std::min(rest.find('/'), rest.find('?'));
        const std::string_view authority = rest.substr(0, end);
        if (authority.empty() || authority.find('@') != std::string_view::npos)
            return invalid_argument("the request target's authority is empty or has userinfo");
        t.authority = std::string(authority);
        rest = end == std::string_view::npos ? std::string_view() : rest.substr(end);
        if (rest.empty() || rest.front() == '?') t.path = "/";
        break;
    }
    if (!t.authority && (rest.empty() || rest.front() != '/'))
        return invalid_argument("the request target must be a path or an absolute http URL");
    if (t.path.empty()) t.path = std::string(rest.substr(0, rest.find('?')));
    return t;
}

const char* allowed_methods(std::string_view path) {
    if (path == "/health" || path == "/v1/models" || path == "/metrics" ||
        path == "/tokenizer_info")
        return "GET, HEAD";
    if (path == "/v1/chat/completions" || path == "/v1/completions" || path == "/tokenize" ||
        path == "/detokenize")
        return "POST";
    if (path == "/v1/sessions") return "GET, HEAD, POST";
    if (path.substr(0, 13) == "/v1/sessions/") return "GET, HEAD, DELETE";
    return "";
}

RequestRules::RequestRules(const GatewayOptions& o) {
    check_host_ =
        !o.allowed_hosts.empty() || (o.access.api_keys.empty() && is_loopback_address(o.host));
    own_names_ = {"localhost", "127.0.0.1", "[::1]"};
    own_names_.push_back(o.host.find(':') != std::string::npos ? "[" + lower(o.host) + "]"
                                                               : lower(o.host));
    for (const std::string& h : o.allowed_hosts) {
        if (h == "*") any_host_ = true;
        allowed_hosts_.push_back(lower(h));
    }
    for (const std::string& origin : o.allowed_origins) {
        if (origin == "*") any_origin_ = true;
        std::string x = lower(origin);
        while (!x.empty() && x.back() == '/') x.pop_back();
        origins_.push_back(std::move(x));
    }
}

bool RequestRules::host_allowed(std::string_view host, uint16_t port) const {
    if (any_host_) return true;
    std::string_view name, given_port;
    if (!split_host(host, name, given_port)) return false;
    const std::string n = lower(name), whole = lower(host);
    const bool our_port = given_port.empty() || given_port == std::to_string(port);
    if (our_port && std::find(own_names_.begin(), own_names_.end(), n) != own_names_.end())
        return true;
    // An allowed host is "name" (any port) or "name:port".
    return std::any_of(allowed_hosts_.begin(), allowed_hosts_.end(),
                       [&](const std::string& h) { return h == n || h == whole; });
}

std::optional<HttpAnswer> RequestRules::check(const RequestHead& req, const RequestTarget& target,
                                              uint16_t port, bool has_body) const {
    if (req.count(http::field::transfer_encoding) > 1 ||
        (req.count(http::field::transfer_encoding) == 1 &&
         !iequals(trim(value_of(req, http::field::transfer_encoding)), "chunked"))) {
        return refuse(501,
                      "Transfer-Encoding '" +
                          std::string(value_of(req, http::field::transfer_encoding)).substr(0, 64) +
                          "' is not supported: only chunked alone");
    }
    const size_t hosts = req.count(http::field::host);
    if (hosts > 1) return refuse(400, "the request has more than one Host header");
    if (hosts == 0 && req.version() >= 11)
        return refuse(400, "an HTTP/1.1 request needs a Host header");
    if (check_host_ && (hosts == 1 || target.authority)) {
        const std::string_view host = target.authority ? std::string_view(*target.authority)
                                                       : value_of(req, http::field::host);
        if (!host_allowed(host, port)) {
            return refuse(403, "this server does not answer to the Host '" +
                                   std::string(host.substr(0, 128)) +
                                   "' (a loopback name, or one given with --allowed-host)");
        }
    }
    if (req.count(http::field::origin) > 0 && allowed_origin(req).empty()) {
        return refuse(403, "requests from the Origin '" +
                               std::string(value_of(req, http::field::origin).substr(0, 128)) +
                               "' are not allowed (--allowed-origin)");
    }
    if (req.count(http::field::authorization) > 1)
        return refuse(400, "the request has more than one Authorization header");
    if (has_body) {
        const std::string_view type = value_of(req, http::field::content_type);
        if (req.count(http::field::content_type) != 1 || !is_json(type)) {
            return refuse(415,
                          "the request body must be JSON (Content-Type: application/json), "
                          "not '" +
                              std::string(type.substr(0, 64)) + "'");
        }
    }
    return std::nullopt;
}

std::string RequestRules::allowed_origin(const RequestHead& req) const {
    if (req.count(http::field::origin) != 1) return "";
    if (any_origin_) return "*";
    const std::string o = lower(value_of(req, http::field::origin));
    for (const std::string& allowed : origins_) {
        if (allowed == o) return allowed;  // the operator's string, never the client's
    }
    return "";
}

HttpAnswer preflight_answer(const std::string& origin, const std::string& allow) {
    HttpAnswer a;
    a.status = 204;
    a.allow_origin = origin;
    a.allow = allow;
    a.preflight = true;
    return a;
}

}  // namespace deltaserve::api
