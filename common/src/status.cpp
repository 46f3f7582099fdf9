#include "deltaserve/common/status.h"

namespace deltaserve {

std::string_view status_code_name(StatusCode code) {
    switch (code) {
        case StatusCode::kOk: return "OK";
        case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
        case StatusCode::kNotFound: return "NOT_FOUND";
        case StatusCode::kAlreadyExists: return "ALREADY_EXISTS";
        case StatusCode::kOutOfRange: return "OUT_OF_RANGE";
        case StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
        case StatusCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
        case StatusCode::kUnavailable: return "UNAVAILABLE";
        case StatusCode::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
        case StatusCode::kDataLoss: return "DATA_LOSS";
        case StatusCode::kUnimplemented: return "UNIMPLEMENTED";
        case StatusCode::kInternal: return "INTERNAL";
        case StatusCode::kUnauthenticated:
            return "UNAUTHENTICATED";
        case StatusCode::kPermissionDenied:
            return "PERMISSION_DENIED";
        case StatusCode::kAborted:
            return "ABORTED";
    }
    return "UNKNOWN";
}

std::string Status::to_string() const {
    if (ok()) return "OK";
    std::string s(status_code_name(code_));
    s += ": ";
    s += message_;
    return s;
}

}  // namespace deltaserve
