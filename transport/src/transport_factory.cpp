#include "deltaserve/transport/transport_factory.h"

#include <cstdlib>
#include <set>
#include <string>

#include "backends.h"

namespace deltaserve::transport {

bool ucx_tls_has_shared_memory(std::string_view ucx_tls) {
    std::string tls(ucx_tls);
    if (tls.empty() && std::getenv("UCX_TLS") != nullptr) tls = std::getenv("UCX_TLS");
    if (tls.empty()) return true;
    const bool excluding = tls.front() == '^';  // "^a,b": every transport but these
    if (excluding) tls.erase(0, 1);
    static const std::set<std::string, std::less<>> kShared = {
        "all", "sm", "shm", "mm", "posix", "sysv", "xpmem", "cma", "knem"};
    bool named = false;
    for (size_t pos = 0; pos <= tls.size();) {
        size_t end = tls.find(',', pos);
        if (end == std::string::npos) end = tls.size();
        named = named || kShared.count(std::string_view(tls).substr(pos, end - pos)) > 0;
        pos = end + 1;
    }
    return excluding ? !named : named;
}

Result<std::unique_ptr<Transport>> make_transport(std::string_view name,
                                                  const TransportOptions& options) {
    if (name == "ucx") return make_ucx_transport(options);
    if (name == "inproc") return make_inproc_transport(options);
    return invalid_argument("unknown transport '" + std::string(name) +
                            "' (expected ucx or inproc)");
}

}  // namespace deltaserve::transport
