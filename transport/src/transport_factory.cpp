#include "deltaserve/transport/transport_factory.h"

#include "backends.h"

namespace deltaserve::transport {

Result<std::unique_ptr<Transport>> make_transport(std::string_view name,
                                                  const TransportOptions& options) {
    if (name == "ucx") return make_ucx_transport(options);
    if (name == "inproc") return make_inproc_transport(options);
    return invalid_argument("unknown transport '" + std::string(name) +
                            "' (expected ucx or inproc)");
}

}  // namespace deltaserve::transport
