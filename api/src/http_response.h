// The bytes of the gateway's HTTP answers, and how a Status becomes one. Every header value
// written here is the gateway's own or validated (a session id passes check_session_id).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "deltaserve/common/status.h"

namespace deltaserve::api {

struct HttpAnswer {
    int status = 200;
    std::string body;
    std::string content_type = "application/json";
    int retry_after_seconds = 0;    // > 0: a Retry-After header (429, 503)
    std::string session_id;         // non-empty: an X-Session-ID header
    std::string kv_source;          // non-empty: an X-KV-Source header (Usage::kv_source)
    bool bearer_challenge = false;  // WWW-Authenticate: Bearer (401)
    std::string allow;              // non-empty: an Allow header (405, OPTIONS)
    // Non-empty: Access-Control-Allow-Origin (an allowed origin, never a client's string) and
    // Vary: Origin.
    std::string allow_origin;
    bool preflight = false;  // a CORS preflight's answer: Access-Control-Allow-Methods (allow),
                             // -Headers and -Max-Age
};

// An OpenAI-shaped error answer: 400 invalid_request_error, 401 authentication_error,
// 404 not_found_error, 409 conflict_error, 413, 429 rate_limit_error, 431, 503 / 504
// server_error; `code` (e.g. "session_not_found") goes in error.code, else the status.
HttpAnswer error_answer(int status, const std::string& message, const std::string& code = "");

// What a Status from the engine or the parser is to a client: kInvalidArgument and
// kOutOfRange 400, kNotFound 404, kAlreadyExists and kFailedPrecondition 409,
// kResourceExhausted 429 (a full KV cache or session table; Retry-After), kUnavailable 503
// (Retry-After), kDeadlineExceeded 504, kUnauthenticated 401 ("invalid_api_key", with a
// Bearer challenge), kPermissionDenied 403, anything else 500. `code` as error_answer's.
HttpAnswer status_answer(const Status& status, const std::string& code = "");

// A turn's or a session call's error; about_session: a kNotFound is the code
// "session_not_found".
HttpAnswer session_error(const Status& status, bool about_session);

// A whole HTTP/1.1 response with Content-Length (none for 204); head_only: without the body
// (the answer to HEAD, whose headers are GET's).
std::string format_response(const HttpAnswer& a, bool keep_alive, bool head_only = false);

// The head of a server-sent-events response (chunked; the connection kept open after it when
// keep_alive, else closed at its end), and one chunk.
std::string format_sse_head(const std::string& session_id, bool keep_alive,
                            const std::string& allow_origin = "");
std::string format_chunk(std::string_view data);  // "" gives the last chunk

}  // namespace deltaserve::api
