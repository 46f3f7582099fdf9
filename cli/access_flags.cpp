#include "access_flags.h"

#include <cstdlib>

namespace deltaserve::cli {

Result<std::vector<std::string>> check_keys(std::vector<std::string> keys, const char* what) {
    for (const std::string& k : keys) DS_RETURN_IF_ERROR(api::check_key(k).with_context(what));
    return keys;
}

Result<std::vector<std::string>> parse_keys(const std::string& list, const char* what) {
    return check_keys(api::split_keys(list), what);
}

void AccessFlags::register_flags(ArgParser& p) {
    p.add_list("api-key", &api_keys,
               "keys clients must send (Authorization: Bearer KEY on /v1/*, apiKey on the chat "
               "RPC), comma-separated or the flag repeated, each a tenant whose sessions no other "
               "key sees; default "
               "$DELTASERVE_API_KEY; without keys the server serves a loopback address only");
    p.add_list(
        "admin-key", &admin_keys,
        "keys of the RPC admin service (every tenant's sessions), comma-separated or the flag "
        "repeated; default "
        "$DELTASERVE_ADMIN_KEY");
    p.add_switch("insecure", &insecure,
                 "serve a non-loopback --host without API keys (anyone who reaches it reads "
                 "every conversation)");
    p.add_switch("metrics-need-key", &metrics_need_key,
                 "GET /metrics needs an API or admin key too");
}

Result<api::AccessOptions> AccessFlags::resolve(const ArgParser& p) const {
    // Every key given with the flag, else the variable's.
    auto from = [&](const char* flag, const std::vector<std::string>& given, const char* env,
                    const char* what) {
        if (p.given(flag)) return check_keys(given, what);
        const char* v = std::getenv(env);
        return parse_keys(v != nullptr ? v : "", env);
    };
    api::AccessOptions o;
    DS_ASSIGN_OR_RETURN(o.api_keys, from("api-key", api_keys, "DELTASERVE_API_KEY", "--api-key"));
    DS_ASSIGN_OR_RETURN(o.admin_keys,
                        from("admin-key", admin_keys, "DELTASERVE_ADMIN_KEY", "--admin-key"));
    o.insecure = insecure;
    o.metrics_need_key = metrics_need_key;
    return o;
}

}  // namespace deltaserve::cli
