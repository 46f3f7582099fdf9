// The access flags of the commands that serve clients (serve; gateway takes the same from
// its cluster config): --api-key, --admin-key, --insecure, --metrics-need-key, with
// DELTASERVE_API_KEY and DELTASERVE_ADMIN_KEY read here (and only here) when a flag is not
// given.
#pragma once

#include <string>
#include <vector>

#include "deltaserve/api/access.h"
#include "deltaserve/common/args.h"

namespace deltaserve::cli {

struct AccessFlags {
    std::vector<std::string> api_keys, admin_keys;  // every --api-key and --admin-key given
    bool insecure = false, metrics_need_key = false;

    void register_flags(ArgParser& p);
    // The keys from the flags, else the environment. Errors: kInvalidArgument for a key
    // that is not printable ASCII.
    Result<api::AccessOptions> resolve(const ArgParser& p) const;
};

// Splits and checks comma-separated keys (a variable or a config value).
Result<std::vector<std::string>> parse_keys(const std::string& list, const char* what);
// Checks keys given one by one (a list flag's values).
Result<std::vector<std::string>> check_keys(std::vector<std::string> keys, const char* what);

}  // namespace deltaserve::cli
