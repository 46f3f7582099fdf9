#include "command_support.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <thread>

#include <unistd.h>

#include "deltaserve/api/cluster_config.h"
#include "deltaserve/common/user_dirs.h"
#include "table.h"

namespace deltaserve::ops {

void add_common(ArgParser& p, Common& c) {
    c.data_dir = default_data_dir();
    p.add("data-dir", &c.data_dir,
          "a stopped node's data dir (deltaserve serve --data-dir; a cluster's data_dir) or a "
          "checkpoint of one, opened read-only");
    p.add("server", &c.server,
          "a running server's admin service, HOST:PORT (serve --rpc-port, a cluster's "
          "gateway.rpc) instead of a data dir");
    if (const char* k = std::getenv("DELTASERVE_ADMIN_KEY")) c.admin_key = k;
    p.add("admin-key", &c.admin_key, "the server's admin key (default $DELTASERVE_ADMIN_KEY)");
    p.add("config", &c.config,
          "a cluster config (deploy/cluster.yaml): its gateway.rpc and admin_key, as --server "
          "and --admin-key");
    p.add_switch("json", &c.as_json, "raw numbers as JSON (null where not known)");
}

void add_watch(ArgParser& p, Common& c) {
    p.add_switch("watch", &c.watch,
                 "show the view again every --interval seconds until interrupted (--server)");
    p.add("interval", &c.interval, "--watch: seconds between views (default 2)");
    p.add("count", &c.count, "--watch: stop after this many views (default: never)");
}

int watch_usage(const Common& c, const char* command) {
    if (!c.watch) return 0;
    if (!c.live())
        return usage_error(std::string(command) +
                           " --watch follows a running server: give --server HOST:PORT or "
                           "--config cluster.yaml");
    if (!(c.interval >= 0.1f && c.interval <= 86400.0f))
        return usage_error("--interval must be in [0.1, 86400] seconds");
    if (c.count < 0) return usage_error("--count must be 0 (never stop) or more");
    return 0;
}

int watch_loop(const Common& c, const char* command, const std::function<int()>& show) {
    if (!c.watch) return show();
    const bool terminal = !c.as_json && isatty(STDOUT_FILENO) != 0;
    for (int32_t n = 0; c.count == 0 || n < c.count; ++n) {
        if (n > 0) {
            std::this_thread::sleep_for(
                std::chrono::milliseconds(static_cast<int64_t>(c.interval * 1000.0f)));
        }
        if (terminal) {
            // Home and clear, as watch(1) redraws.
            std::printf("\033[H\033[2J");
        }
        if (!c.as_json) {
            std::printf("Every %.1fs: %s on %s  %s\n\n", static_cast<double>(c.interval), command,
                        c.server.c_str(), utc(unix_now()).c_str());
        }
        const int code = show();
        std::fflush(stdout);
        if (code != 0) return code;
        if (!terminal && !c.as_json) std::printf("\n");
    }
    return 0;
}

std::string take_id(int& argc, char**& argv) {
    if (argc < 1 || argv[0][0] == '-') return "";
    --argc;
    return *argv++;
}

std::string json_text(const Common& c, const json& j) { return j.dump(c.watch ? -1 : 2); }

int usage_error(const std::string& what) {
    std::fprintf(stderr, "deltactl: error: %s\n", what.c_str());
    return 2;
}

int store_error(const Status& s) {
    std::fprintf(stderr, "deltactl: error: %s\n", s.message().c_str());
    return 1;
}

// The stores of --data-dir; nullptr after printing why (exit code in *code).
std::unique_ptr<StoreView> open_view(const Common& c, int* code, bool writable) {
    if (c.data_dir.empty()) {
        *code = usage_error("--data-dir: no data dir (neither XDG_DATA_HOME nor HOME is set)");
        return nullptr;
    }
    auto v = StoreView::open(c.data_dir, writable);
    if (!v.ok()) {
        *code = store_error(v.status());
        return nullptr;
    }
    return std::move(*v);
}

// The admin service of --server; nullptr after printing why (exit code in *code).
// (--config fills in c.server and c.admin_key where not given.)
std::unique_ptr<LiveAdmin> connect_live(Common& c, int* code) {
    if (!c.config.empty()) {
        auto cfg = api::load_cluster_config(c.config);
        if (!cfg.ok()) {
            *code = usage_error(cfg.status().message());
            return nullptr;
        }
        if (c.server.empty()) c.server = cfg->gateway_rpc;
        if (c.admin_key.empty()) c.admin_key = cfg->admin_key;
        if (c.server.empty()) {
            *code = usage_error(c.config + " names no gateway.rpc: give --server HOST:PORT");
            return nullptr;
        }
    }
    auto a = LiveAdmin::connect(c.server, c.admin_key);
    if (!a.ok()) {
        *code = a.status().code() == StatusCode::kInvalidArgument
                    ? usage_error(a.status().message())
                    : store_error(a.status());
        return nullptr;
    }
    return std::move(*a);
}

// A command that reads only stores: --server is a usage error (exit code 2, else 0).
int offline_only(const Common& c, const char* command) {
    if (!c.live()) return 0;
    return usage_error(std::string(command) +
                       " reads a stopped node's store only, for now: give --data-dir (a "
                       "stopped node's, or a checkpoint)");
}

int64_t unix_now() { return static_cast<int64_t>(std::time(nullptr)); }

std::string or_unknown(int64_t v) { return v < 0 ? kUnknown : std::to_string(v); }
json or_null(int64_t v) { return v < 0 ? json() : json(v); }
json or_null(double v) { return std::isnan(v) ? json() : json(v); }

std::string utc(int64_t t) {
    if (t <= 0) return kUnknown;
    char buf[32];
    const std::time_t tt = static_cast<std::time_t>(t);
    std::tm tm{};
    gmtime_r(&tt, &tm);
    std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

std::string codec_name(kvstore::KvCodecId c) {
    switch (c) {
        case kvstore::KvCodecId::kRows:
            return "full";
        case kvstore::KvCodecId::kDeltaKv:
            return "deltakv";
        default:
            return "none";
    }
}

std::string node_of(const Store* s) { return s == nullptr || s->name.empty() ? "-" : s->name; }

std::string bytes_or_unknown(int64_t b) {
    return b < 0 ? kUnknown : human_bytes(static_cast<uint64_t>(b));
}

std::vector<std::string> session_columns() {
    return {"SESSION", "NODE", "TURNS", "TOKENS",   "POLICY",   "KEEP",
            "DECODE",  "HOST", "DISK",  "LAST USE", "TTL LEFT", "PINNED"};
}

}  // namespace deltaserve::ops
