#include "ucx_status.h"

#include <string>

namespace deltaserve::transport {

Status ucx_status(ucs_status_t status, std::string_view what) {
    if (status == UCS_OK) return {};
    std::string message = std::string(what) + ": " + ucs_status_string(status);
    switch (status) {
        case UCS_ERR_UNREACHABLE:
        case UCS_ERR_CONNECTION_RESET:
        case UCS_ERR_ENDPOINT_TIMEOUT:
        case UCS_ERR_REJECTED:
        case UCS_ERR_CANCELED:
        case UCS_ERR_TIMED_OUT:
        case UCS_ERR_NOT_CONNECTED:
        case UCS_ERR_IO_ERROR:
        case UCS_ERR_NO_DEVICE:
        case UCS_ERR_BUSY:
            return {StatusCode::kUnavailable, std::move(message)};
        case UCS_ERR_NO_MEMORY:
        case UCS_ERR_NO_RESOURCE:
        case UCS_ERR_EXCEEDS_LIMIT:
        case UCS_ERR_OUT_OF_RANGE:
            return {StatusCode::kResourceExhausted, std::move(message)};
        case UCS_ERR_INVALID_PARAM:
        case UCS_ERR_INVALID_ADDR:
        case UCS_ERR_UNSUPPORTED:
        case UCS_ERR_MESSAGE_TRUNCATED:
            return {StatusCode::kInvalidArgument, std::move(message)};
        case UCS_ERR_ALREADY_EXISTS:
            return {StatusCode::kAlreadyExists, std::move(message)};
        default:
            if (UCS_IS_LINK_ERROR(status) || UCS_IS_ENDPOINT_ERROR(status)) {
                return {StatusCode::kUnavailable, std::move(message)};
            }
            return {StatusCode::kInternal, std::move(message)};
    }
}

}  // namespace deltaserve::transport
