#include "access_flags.h"

#include <cstdlib>

namespace deltaserve::cli {

Result<std::vector<std::string>> parse_keys(const std::string& list, const char* what) {
    std::vector<std::string> keys = api::split_keys(list);
    for (const std::string& k : keys) DS_RETURN_IF_ERROR(api::check_key(k).with_context(what));
    return keys;
}

void AccessFlags::register_flags(ArgParser& p) {
    p.add("api-key", &api_key,
          "keys clients must send (Authorization: Bearer KEY on /v1/*, apiKey on the chat "
          "RPC), comma-separated, each a tenant whose sessions no other key sees; default "
          "$DELTASERVE_API_KEY; without keys the server serves a loopback address only");
    p.add("admin-key", &admin_key,
          "keys of the RPC admin service (every tenant's sessions), comma-separated; default "
          "$DELTASERVE_ADMIN_KEY");
    p.add_switch("insecure", &insecure,
                 "serve a non-loopback --host without API keys (anyone who reaches it reads "
                 "every conversation)");
    p.add_switch("metrics-need-key", &metrics_need_key,
                 "GET /metrics needs an API or admin key too");
}

Result<api::AccessOptions> AccessFlags::resolve(const ArgParser& p) const {
    auto from = [&](const char* flag, const std::string& value, const char* env) {
        if (p.given(flag)) return value;
        const char* v = std::getenv(env);
        return std::string(v != nullptr ? v : "");
    };
    api::AccessOptions o;
    DS_ASSIGN_OR_RETURN(o.api_keys,
                        parse_keys(from("api-key", api_key, "DELTASERVE_API_KEY"), "--api-key"));
    DS_ASSIGN_OR_RETURN(
        o.admin_keys,
        parse_keys(from("admin-key", admin_key, "DELTASERVE_ADMIN_KEY"), "--admin-key"));
    o.insecure = insecure;
    o.metrics_need_key = metrics_need_key;
    return o;
}

}  // namespace deltaserve::cli
