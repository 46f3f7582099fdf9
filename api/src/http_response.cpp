#include "http_response.h"

#include <boost/beast/http/status.hpp>
#include <cstdio>

#include "deltaserve/api/openai_protocol.h"

namespace deltaserve::api {

namespace {

const char* error_type(int status) {
    switch (status) {
        case 401:
            return "authentication_error";
        case 403:
            return "permission_error";
        case 404:
            return "not_found_error";
        case 409:
            return "conflict_error";
        case 429:
            return "rate_limit_error";
        default:
            return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

}  // namespace

HttpAnswer error_answer(int status, const std::string& message, const std::string& code) {
    HttpAnswer a;
    a.status = status;
    a.body = error_json(message, error_type(status), status, code);
    if (status == 429 || status == 503) a.retry_after_seconds = 1;
    return a;
}

HttpAnswer status_answer(const Status& s, const std::string& code) {
    switch (s.code()) {
        case StatusCode::kOk:
            return error_answer(500, "no error");
        case StatusCode::kInvalidArgument:
        case StatusCode::kOutOfRange:
            return error_answer(400, s.message(), code);
        case StatusCode::kNotFound:
            return error_answer(404, s.message(), code);
        case StatusCode::kAlreadyExists:
        case StatusCode::kFailedPrecondition:
        case StatusCode::kAborted:
            return error_answer(409, s.message(), code);
        case StatusCode::kResourceExhausted:
            return error_answer(429, s.message(), code);
        case StatusCode::kUnavailable:
            return error_answer(503, s.message(), code);
        case StatusCode::kDeadlineExceeded:
            return error_answer(504, s.message(), code);
        case StatusCode::kUnauthenticated: {
            HttpAnswer a = error_answer(401, s.message(), code.empty() ? "invalid_api_key" : code);
            a.bearer_challenge = true;
            return a;
        }
        case StatusCode::kPermissionDenied:
            return error_answer(403, s.message(), code);
        default:
            return error_answer(500, s.message(), code);
    }
}

HttpAnswer session_error(const Status& st, bool about_session) {
    if (!about_session) return status_answer(st);
    switch (st.code()) {
        case StatusCode::kNotFound:
            return status_answer(st, "session_not_found");
        case StatusCode::kAborted:
            return status_answer(st, "session_turn_mismatch");
        case StatusCode::kDataLoss:  // its record came through a repair (ClusterChatEngine)
            return error_answer(409, st.message(), "session_history_lost");
        default:
            return status_answer(st);
    }
}

std::string format_response(const HttpAnswer& a, bool keep_alive, bool head_only) {
    const auto status = static_cast<boost::beast::http::status>(a.status);
    const bool no_content = a.status == 204;
    std::string out = "HTTP/1.1 " + std::to_string(a.status) + " " +
                      std::string(boost::beast::http::obsolete_reason(status)) +
                      "\r\nServer: deltaserve\r\n";
    if (!no_content) {
        out += "Content-Type: " + a.content_type +
               "\r\nContent-Length: " + std::to_string(a.body.size()) + "\r\n";
    }
    if (!a.allow.empty()) out += "Allow: " + a.allow + "\r\n";
    if (!a.allow_origin.empty())
        out += "Access-Control-Allow-Origin: " + a.allow_origin + "\r\nVary: Origin\r\n";
    if (a.preflight) {
        out += "Access-Control-Allow-Methods: " + a.allow +
               "\r\nAccess-Control-Allow-Headers: Authorization, Content-Type, X-Session-ID"
               "\r\nAccess-Control-Max-Age: 600\r\n";
    }
    if (a.retry_after_seconds > 0)
        out += "Retry-After: " + std::to_string(a.retry_after_seconds) + "\r\n";
    if (!a.session_id.empty()) out += "X-Session-ID: " + a.session_id + "\r\n";
    if (!a.kv_source.empty()) out += "X-KV-Source: " + a.kv_source + "\r\n";
    if (a.bearer_challenge) out += "WWW-Authenticate: Bearer\r\n";
    out += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
    if (!head_only && !no_content) out += a.body;
    return out;
}

std::string format_sse_head(const std::string& session_id, bool keep_alive,
                            const std::string& allow_origin) {
    std::string out =
        "HTTP/1.1 200 OK\r\nServer: deltaserve\r\nContent-Type: text/event-stream\r\n"
        "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n";
    out += keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
    if (!session_id.empty()) out += "X-Session-ID: " + session_id + "\r\n";
    if (!allow_origin.empty())
        out += "Access-Control-Allow-Origin: " + allow_origin + "\r\nVary: Origin\r\n";
    return out + "\r\n";
}

std::string format_chunk(std::string_view data) {
    char size[24];
    std::snprintf(size, sizeof size, "%zx\r\n", data.size());
    std::string out(size);
    out.append(data);
    out += "\r\n";
    return out;
}

}  // namespace deltaserve::api
