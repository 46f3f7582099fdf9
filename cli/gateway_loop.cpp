#include "gateway_loop.h"

#include <cstdio>
#include <memory>

#include "deltaserve/api/chat_rpc_server.h"
#include "run_options.h"
#include "stop_signals.h"

namespace deltaserve::cli {

int serve_gateway(api::ChatEngine& engine, const api::GatewayOptions& options,
                  const std::string& rpc_address, const std::string& serving,
                  const sigset_t& stop_signals, const std::function<Status(uint16_t)>& on_serving,
                  const std::function<void()>& on_stop) {
    if (options.access.api_keys.empty()) {
        std::fprintf(stderr,
                     options.access.insecure
                         ? "deltaserve: WARNING: no API key, and --insecure: anyone who reaches "
                           "%s reads every conversation\n"
                         : "deltaserve: no API key: serving the loopback address %s only "
                           "(--api-key to serve others)\n",
                     options.host.c_str());
    }
    if (!rpc_address.empty()) {  // the chat RPC binds by the same rule
        std::string host = rpc_address.substr(0, rpc_address.rfind(':'));
        if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
        if (Status st = api::check_bind(host, options.access); !st.ok()) {
            print_error(st);
            return 2;
        }
    }
    auto gateway = api::HttpGateway::start(engine, options);
    if (!gateway) {
        print_error(gateway.error());
        return 1;
    }
    std::unique_ptr<api::ChatRpcServer> rpc;
    if (!rpc_address.empty()) {
        api::ChatRpcOptions ro;
        ro.sampling = options.sampling;
        ro.default_max_tokens = options.default_max_tokens;
        ro.access = options.access;
        auto r = api::ChatRpcServer::start(rpc_address, engine, ro);
        if (!r) {
            print_error(r.error());
            return 1;
        }
        rpc = std::move(*r);
        std::fprintf(stderr, "deltaserve: chat RPC on port %u\n",
                     static_cast<unsigned>(rpc->port()));
    }
    if (on_serving) {
        if (Status st = on_serving((*gateway)->port()); !st.ok()) {
            print_error(st);
            (*gateway)->stop();
            return 1;
        }
    }
    std::fprintf(stderr, "deltaserve: serving %s on http://%s:%u%s\n", engine.model_id().c_str(),
                 options.host.c_str(), static_cast<unsigned>((*gateway)->port()), serving.c_str());
    std::fflush(stderr);
    std::fprintf(stderr, "deltaserve: %s, stopping\n", wait_for_stop(stop_signals));
    if (on_stop) on_stop();
    (*gateway)->stop();
    return 0;
}

}  // namespace deltaserve::cli
