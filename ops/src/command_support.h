// What deltactl's cache commands share: the flags that say where to look (a data dir, or a
// running server's admin service), the exit codes (0 ok, 1 a server or store error, 2 usage)
// and the ways values are shown (table.h for tables).
#pragma once

#include <cstdint>
#include <functional>
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
    // --watch: the view again every `interval` seconds, `count` times (0: until interrupted).
    bool watch = false;
    float interval = 2.0f;
    int32_t count = 0;
    bool live() const { return !server.empty() || !config.empty(); }
};

// --data-dir (default serve's), --server, --admin-key, --config, --json.
void add_common(ArgParser& p, Common& c);
// --watch, --interval, --count: for the live views that change (sessions, tiers, cluster).
void add_watch(ArgParser& p, Common& c);
// --watch's flags checked: 2 after printing why (--watch on a data dir, a bad --interval or
// --count), else 0.
int watch_usage(const Common& c, const char* command);
// Runs `show` once, or with --watch again every interval: on a terminal the screen is
// redrawn under a header line, elsewhere each view follows a line with its time; with --json
// each view is one line (JSON lines). Returns the first nonzero exit code of `show`, or 0.
int watch_loop(const Common& c, const char* command, const std::function<int()>& show);
// A command's leading ID (an argument not starting with '-'), taken off argv; "" when none.
std::string take_id(int& argc, char**& argv);
// A JSON document as the command prints it: indented, or one line under --watch.
std::string json_text(const Common& c, const json& j);
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
