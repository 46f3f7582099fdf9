// What deltactl's cache commands share: the flags that say where to look (a data dir, or a
// running server's admin service), the exit codes (0 ok, 1 a server or store error, 2 usage)
// and the ways values are shown (table.h for tables).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "deltaserve/common/args.h"
#include "deltaserve/common/status.h"
#include "deltaserve/kvstore/kv_policy.h"
#include "live_admin.h"
#include "store_view.h"

namespace deltaserve::ops {

using json = nlohmann::json;

struct Common {
    std::string data_dir, server, admin_key, config;
    bool as_json = false;
    bool live() const { return !server.empty() || !config.empty(); }
};

// --data-dir (default serve's), --server, --admin-key, --config, --json.
void add_common(ArgParser& p, Common& c);
// Print "deltactl: error: ..." and return the exit code: 2, or 1.
int usage_error(const std::string& what);
int store_error(const Status& s);
// The stores of --data-dir; nullptr after printing why (exit code in *code).
std::unique_ptr<StoreView> open_view(const Common& c, int* code, bool writable = false);
// The admin service of --server; nullptr after printing why (exit code in *code).
// (--config fills in c.server and c.admin_key where not given.)
std::unique_ptr<LiveAdmin> connect_live(Common& c, int* code);
// A command that reads only stores: --server is a usage error (exit code 2, else 0).
int offline_only(const Common& c, const char* command);

int64_t unix_now();
std::string or_unknown(int64_t v);  // kUnknown below 0
json or_null(int64_t v);            // null below 0
json or_null(double v);             // null for NaN
std::string utc(int64_t unix_seconds);
std::string codec_name(kvstore::KvCodecId c);
std::string node_of(const Store* s);
std::string bytes_or_unknown(int64_t b);
// The header of deltactl sessions' table, live or offline.
std::vector<std::string> session_columns();

}  // namespace deltaserve::ops
