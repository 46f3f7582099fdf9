// The rules a request's head passes before the gateway reads its body or routes it: its
// framing (Transfer-Encoding), its target (origin or absolute form), Host (RFC 9112 §3.2,
// and the DNS-rebinding guard), Origin (browsers' cross-origin requests, CORS), the body's
// Content-Type (JSON only, so a web page's "simple" text/plain post is refused), and a single
// Authorization header. Immutable after construction; safe to share between threads.
#pragma once

#include <boost/beast/http/fields.hpp>
#include <boost/beast/http/message.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "deltaserve/api/http_gateway.h"
#include "http_response.h"

namespace deltaserve::api {

using RequestHead = boost::beast::http::request_header<>;

// The path a target names (without its query) and, for the absolute form
// ("http://host:port/path", RFC 9112 §3.2.2), its authority, which stands for Host.
struct RequestTarget {
    std::string path;
    std::optional<std::string> authority;
};

// Errors: kInvalidArgument for a target in neither form (asterisk form, userinfo).
Result<RequestTarget> parse_target(std::string_view target);

// The methods a path answers ("GET, HEAD", ...: an Allow header's value); "" for no route.
const char* allowed_methods(std::string_view path);

class RequestRules {
  public:
    explicit RequestRules(const GatewayOptions& options);

    // Whether Host is checked: on a loopback address without API keys, or when
    // allowed_hosts is given.
    bool checks_host() const { return check_host_; }

    // The refusal of a request head, or nullopt when it passes: 501 for a Transfer-Encoding
    // other than "chunked" alone; 400 for no Host (HTTP/1.1), more than one Host, or more
    // than one Authorization; 403 for a Host that names no address this server answers to
    // (port: the one it listens on), or an Origin not allowed; 415 for a body (has_body) whose
    // Content-Type is not application/json.
    std::optional<HttpAnswer> check(const RequestHead& req, const RequestTarget& target,
                                    uint16_t port, bool has_body) const;

    // What Access-Control-Allow-Origin names for the request's Origin: the allowed origin it
    // matches, "*" when any is allowed; "" when it has none or one not allowed.
    std::string allowed_origin(const RequestHead& req) const;

  private:
    bool host_allowed(std::string_view host, uint16_t port) const;

    bool check_host_ = false;
    bool any_host_ = false, any_origin_ = false;
    std::vector<std::string> own_names_;      // loopback names and the bound address
    std::vector<std::string> allowed_hosts_;  // GatewayOptions::allowed_hosts
    std::vector<std::string> origins_;        // GatewayOptions::allowed_origins
    // All lower-case.
};

// The answer to a CORS preflight (OPTIONS with Origin and Access-Control-Request-Method)
// from an allowed origin: 204 naming the origin, the path's methods and the headers a client
// may send.
HttpAnswer preflight_answer(const std::string& origin, const std::string& allow);

}  // namespace deltaserve::api
