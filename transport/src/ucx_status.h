// The one place ucs_status_t becomes a Status (STYLE.md: one adapter per foreign error type).
#pragma once

#include <ucs/type/status.h>

#include <string_view>

#include "deltaserve/common/status.h"

namespace deltaserve::transport {

// "what: UCX's message". Errors of a peer or a link (unreachable, reset, timed out,
// canceled) become kUnavailable; running out of something kResourceExhausted; bad
// parameters kInvalidArgument; the rest kInternal.
Status ucx_status(ucs_status_t status, std::string_view what);

}  // namespace deltaserve::transport
