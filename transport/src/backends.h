// The backends make_transport chooses between (each in its own file).
#pragma once

#include "deltaserve/transport/transport_factory.h"

namespace deltaserve::transport {

Result<std::unique_ptr<Transport>> make_inproc_transport(const TransportOptions& options);
Result<std::unique_ptr<Transport>> make_ucx_transport(const TransportOptions& options);

}  // namespace deltaserve::transport
