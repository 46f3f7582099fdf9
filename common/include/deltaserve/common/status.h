// Status and Result<T>: the one error convention of deltaserve.
//
// Business logic returns these; invariants abort through DS_CHECK. Result<T> mirrors the
// surface of std::expected<T, Status> (has_value, value, error, operator*, operator->) so
// it can become an alias once the toolchain has it. Both are [[nodiscard]].
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace deltaserve {

// Canonical codes, as in abseil / gRPC.
enum class StatusCode {
    kOk = 0,
    kInvalidArgument,
    kNotFound,
    kAlreadyExists,
    kOutOfRange,
    kFailedPrecondition,
    kResourceExhausted,
    kUnavailable,
    kDeadlineExceeded,
    kDataLoss,
    kUnimplemented,
    kInternal,
    kUnauthenticated,   // no or a wrong credential (HTTP 401)
    kPermissionDenied,  // a credential that does not allow this (HTTP 403)
    kAborted,           // the state is not the one the caller expected (HTTP 409)
};

std::string_view status_code_name(StatusCode code);

class [[nodiscard]] Status {
public:
    Status() = default;
    Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

    static Status ok_status() { return {}; }

    bool ok() const { return code_ == StatusCode::kOk; }
    StatusCode code() const { return code_; }
    const std::string& message() const { return message_; }

    // "INVALID_ARGUMENT: <message>"; "OK" for success.
    std::string to_string() const;

    // Prefixes the message with context, e.g. "loading foo.gguf: ".
    Status with_context(std::string_view context) const {
        if (ok()) return *this;
        return Status(code_, std::string(context) + ": " + message_);
    }

private:
    StatusCode code_ = StatusCode::kOk;
    std::string message_;
};

inline Status invalid_argument(std::string msg) {
    return {StatusCode::kInvalidArgument, std::move(msg)};
}
inline Status not_found(std::string msg) { return {StatusCode::kNotFound, std::move(msg)}; }
inline Status out_of_range(std::string msg) { return {StatusCode::kOutOfRange, std::move(msg)}; }
inline Status failed_precondition(std::string msg) {
    return {StatusCode::kFailedPrecondition, std::move(msg)};
}
inline Status resource_exhausted(std::string msg) {
    return {StatusCode::kResourceExhausted, std::move(msg)};
}
inline Status data_loss(std::string msg) { return {StatusCode::kDataLoss, std::move(msg)}; }
inline Status unimplemented(std::string msg) {
    return {StatusCode::kUnimplemented, std::move(msg)};
}
inline Status internal_error(std::string msg) { return {StatusCode::kInternal, std::move(msg)}; }
inline Status unauthenticated(std::string msg) {
    return {StatusCode::kUnauthenticated, std::move(msg)};
}
inline Status permission_denied(std::string msg) {
    return {StatusCode::kPermissionDenied, std::move(msg)};
}
inline Status unavailable(std::string msg) { return {StatusCode::kUnavailable, std::move(msg)}; }
inline Status aborted(std::string msg) { return {StatusCode::kAborted, std::move(msg)}; }
inline Status deadline_exceeded(std::string msg) {
    return {StatusCode::kDeadlineExceeded, std::move(msg)};
}

// A value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
public:
    Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit like std::expected
    Result(Status status) : v_(std::move(status)) {  // NOLINT
        if (std::get<Status>(v_).ok()) {
            std::fprintf(stderr, "deltaserve: Result constructed from an OK Status\n");
            std::abort();
        }
    }

    bool has_value() const { return v_.index() == 0; }
    bool ok() const { return has_value(); }
    explicit operator bool() const { return has_value(); }

    T& value() & { return check(), std::get<T>(v_); }
    const T& value() const& { return check(), std::get<T>(v_); }
    T&& value() && { return check(), std::get<T>(std::move(v_)); }
    T& operator*() & { return value(); }
    const T& operator*() const& { return value(); }
    T&& operator*() && { return std::move(*this).value(); }
    T* operator->() { return &value(); }
    const T* operator->() const { return &value(); }

    // The error; OK when a value is held.
    Status error() const { return has_value() ? Status() : std::get<Status>(v_); }
    Status status() const { return error(); }

private:
    void check() const {
        if (!has_value()) {
            std::fprintf(stderr, "deltaserve: value() on an error Result: %s\n",
                         std::get<Status>(v_).to_string().c_str());
            std::abort();
        }
    }
    std::variant<T, Status> v_;
};

}  // namespace deltaserve

#define DS_CONCAT_INNER_(a, b) a##b
#define DS_CONCAT_(a, b) DS_CONCAT_INNER_(a, b)

#define DS_RETURN_IF_ERROR(expr)                         \
    do {                                                 \
        ::deltaserve::Status ds_status_ = (expr);        \
        if (!ds_status_.ok()) return ds_status_;         \
    } while (0)

#define DS_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
    auto tmp = (expr);                            \
    if (!tmp.has_value()) return tmp.error();     \
    lhs = std::move(tmp).value()

// DS_ASSIGN_OR_RETURN(auto x, make_x()); returns the error from the enclosing function.
#define DS_ASSIGN_OR_RETURN(lhs, expr) \
    DS_ASSIGN_OR_RETURN_IMPL_(DS_CONCAT_(ds_result_, __LINE__), lhs, expr)

// Invariant checks: a failure is a bug, so it aborts with the location and message.
#define DS_CHECK(cond, ...)                                                              \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            std::fprintf(stderr, "%s:%d: check failed: %s " __VA_OPT__("(%s)") "\n",    \
                         __FILE__, __LINE__, #cond __VA_OPT__(, __VA_ARGS__));           \
            std::abort();                                                                \
        }                                                                                \
    } while (0)
