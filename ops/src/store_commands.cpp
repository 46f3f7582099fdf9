// deltactl's views of a stored cache, offline (store_view.h): sessions, session describe,
// blocks, tiers and verify on a data dir. Exit codes: 0 ok, 1 a store error (or, for
// verify, damage found), 2 usage.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "deltaserve/api/cluster_config.h"
#include "deltaserve/common/args.h"
#include "deltaserve/common/crc32c.h"
#include "deltaserve/common/logging.h"
#include "deltaserve/common/user_dirs.h"
#include "deltaserve/kvstore/kv_rows_info.h"
#include "live_admin.h"
#include "store_view.h"
#include "table.h"

namespace deltaserve::ops {

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

struct Common {
    std::string data_dir, server, admin_key, config;
    bool as_json = false;
    bool live() const { return !server.empty() || !config.empty(); }
};

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

int usage_error(const std::string& what) {
    std::fprintf(stderr, "deltactl: error: %s\n", what.c_str());
    return 2;
}

int store_error(const Status& s) {
    std::fprintf(stderr, "deltactl: error: %s\n", s.message().c_str());
    return 1;
}

// The stores of --data-dir; nullptr after printing why (exit code in *code).
std::unique_ptr<StoreView> open_view(const Common& c, int* code, bool writable = false) {
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

// What one session's stored blocks hold, read and checked block by block.
struct LayerSum {
    bool full = true;
    int64_t sinks = 0, references = 0, latents = 0, buffer = 0;
    uint64_t exact_bytes = 0, latent_bytes = 0;
    double err_sq = 0.0;
    int64_t err_latents = 0;
    double error() const {
        if (full) return NAN;
        if (latents == 0) return 0.0;
        return err_latents > 0 ? std::sqrt(err_sq / static_cast<double>(err_latents)) : NAN;
    }
};
struct BlockRow {
    uint64_t key = 0;
    int32_t begin = 0, end = 0;
    uint64_t bytes = 0;
    bool held = false;
    std::string check;   // ok, or why not
    double error = NAN;  // mean over the layers that measured
};
struct Described {
    std::vector<LayerSum> layers;
    std::vector<BlockRow> blocks;
    std::string policy = kUnknown;
    double keep = NAN;  // bytes over full KV's fp16
    int64_t tokens_readable = 0;
};

Described describe_blocks(StoreView& view, const StoredSession& s) {
    Described d;
    uint64_t good_bytes = 0, full_token_bytes = 0;
    int32_t prev_end = 0;
    for (size_t i = 0; i < s.record.keys.size(); ++i) {
        BlockRow b;
        b.key = s.record.keys[i];
        b.begin = prev_end;
        b.end = prev_end = s.record.ends[i];
        auto bytes = view.read_block(*s.store, b.key);
        if (!bytes.ok()) {
            b.check = bytes.status().code() == StatusCode::kNotFound ? "missing" : "unreadable";
            d.blocks.push_back(b);
            continue;
        }
        b.held = true;
        b.bytes = bytes->size();
        std::string fault;
        auto v = parse_any_block(*bytes, &fault);
        if (!v.ok()) {
            b.check = fault;
            d.blocks.push_back(b);
            continue;
        }
        const kvstore::KvBlockMeta& m = v->meta;
        if (m.key != b.key || m.begin != b.begin || m.end != b.end) {
            b.check = "another block";
        } else if (s.record.crcs[i] != 0 && s.record.crcs[i] != crc32c(*bytes)) {
            b.check = "another export";
        } else {
            b.check = "ok";
        }
        d.policy = codec_name(m.codec);
        if (d.layers.size() < static_cast<size_t>(m.n_layers())) d.layers.resize(m.n_layers());
        double err_sum = 0.0;
        int err_n = 0;
        const int32_t n = m.end - m.begin;
        for (int32_t l = 0; l < m.n_layers(); ++l) {
            auto info = kvstore::kv_rows_info(m.codec, m.codec_state, l, m.begin, m.end,
                                              v->parts[static_cast<size_t>(l)]);
            if (!info.ok()) {
                b.check = "layer " + std::to_string(l) + " does not parse";
                break;
            }
            LayerSum& L = d.layers[static_cast<size_t>(l)];
            L.full = info->full;
            L.sinks += info->sinks;
            L.references += info->references;
            L.latents += info->latents;
            L.buffer += info->buffer;
            L.exact_bytes += info->exact_bytes;
            L.latent_bytes += info->latent_bytes;
            const float e = m.layer_error[static_cast<size_t>(l)];
            if (!std::isnan(e) && info->latents > 0) {
                L.err_sq += static_cast<double>(e) * e * info->latents;
                L.err_latents += info->latents;
            }
            if (!std::isnan(e)) {
                err_sum += e;
                ++err_n;
            }
            if (info->full && full_token_bytes == 0 && n > 0) {
                // A full layer's rows: K and V of every token; full KV's bytes per token.
                full_token_bytes = info->exact_bytes / static_cast<uint64_t>(n) *
                                   static_cast<uint64_t>(m.n_layers());
            }
        }
        if (err_n > 0) b.error = err_sum / err_n;
        if (b.check == "ok") {
            good_bytes += b.bytes;
            d.tokens_readable += n;
        }
        d.blocks.push_back(b);
    }
    if (full_token_bytes > 0 && d.tokens_readable > 0)
        d.keep = static_cast<double>(good_bytes) /
                 (static_cast<double>(full_token_bytes) * static_cast<double>(d.tokens_readable));
    return d;
}

json session_json(const StoredSession& s) {
    return {{"key", s.key},
            {"tenant", s.tenant},
            {"id", s.id},
            {"node", s.has_gateway_record ? json(s.node) : json()},
            {"turns", or_null(int64_t{s.turns})},
            {"messages", or_null(int64_t{s.messages})},
            {"tokens", or_null(s.tokens)},
            {"stored_tokens", s.has_kv_record ? json(s.record.tokens.size()) : json()},
            {"blocks", s.has_kv_record ? json(s.record.keys.size()) : json()},
            {"blocks_held", s.has_kv_record ? json(s.blocks_held) : json()},
            {"disk_bytes", s.has_kv_record ? json(s.disk_bytes) : json()},
            {"host_bytes", json()},
            {"decode_bytes", json()},
            {"last_used", s.last_used > 0 ? json(s.last_used) : json()},
            {"ttl_left_seconds", json()},
            {"pinned", json()},
            {"store", s.store != nullptr ? json(s.store->dir) : json()},
            {"fingerprint", s.has_kv_record ? json(hex64(s.fingerprint)) : json()}};
}

std::string bytes_or_unknown(int64_t b) {
    return b < 0 ? kUnknown : human_bytes(static_cast<uint64_t>(b));
}

int print_live_sessions(std::vector<api::SessionRow> rows, const Common& c,
                        const std::string& sort_by, const std::string* tenant,
                        const std::string* node) {
    std::erase_if(rows, [&](const api::SessionRow& r) {
        return (tenant != nullptr && r.info.tenant != *tenant) ||
               (node != nullptr && r.node != *node);
    });
    const auto total = [](const api::SessionRow& r) {
        return std::max<int64_t>(0, r.kv.decode_bytes) + std::max<int64_t>(0, r.kv.host_bytes) +
               std::max<int64_t>(0, r.kv.disk_bytes);
    };
    std::stable_sort(rows.begin(), rows.end(),
                     [&](const api::SessionRow& a, const api::SessionRow& b) {
                         if (sort_by == "tokens") return a.info.tokens > b.info.tokens;
                         if (sort_by == "turns") return a.info.turns > b.info.turns;
                         if (sort_by == "bytes") return total(a) > total(b);
                         if (sort_by == "name") return a.key < b.key;
                         return a.last_use_unix > b.last_use_unix;
                     });
    if (c.as_json) {
        json out = json::array();
        for (const auto& r : rows) {
            const bool kv = !r.kv.id.empty();
            const auto known = [&](int64_t v) { return kv ? or_null(v) : json(); };
            out.push_back({{"key", r.key},
                           {"tenant", r.info.tenant},
                           {"id", r.info.id},
                           {"node", r.node.empty() ? json() : json(r.node)},
                           {"turns", r.info.turns},
                           {"messages", r.info.messages},
                           {"tokens", r.info.tokens},
                           {"running", r.info.running},
                           {"in_memory", r.in_memory},
                           {"policy", kv && !r.kv.policy.empty() ? json(r.kv.policy) : json()},
                           {"keep_ratio", kv ? or_null(r.kv.keep_ratio) : json()},
                           {"decode_tokens", known(r.kv.tokens)},
                           {"decode_bytes", known(r.kv.decode_bytes)},
                           {"stored_tokens", known(r.kv.stored_tokens)},
                           {"blocks", known(r.kv.blocks)},
                           {"host_bytes", known(r.kv.host_bytes)},
                           {"disk_bytes", known(r.kv.disk_bytes)},
                           {"last_used", r.last_use_unix > 0 ? json(r.last_use_unix) : json()},
                           {"ttl_left_seconds", or_null(r.ttl_left_seconds)},
                           {"pinned", json()}});
        }
        std::printf("%s\n", out.dump(2).c_str());
        return 0;
    }
    Table t({"SESSION", "NODE", "TURNS", "TOKENS", "POLICY", "KEEP", "DECODE", "HOST", "DISK",
             "LAST USE", "TTL LEFT", "PINNED"});
    const int64_t now = unix_now();
    for (const auto& r : rows) {
        const bool kv = !r.kv.id.empty();
        std::string decode = kUnknown;
        if (r.info.running) {
            decode = "running";
        } else if (kv) {
            decode = bytes_or_unknown(r.kv.decode_bytes);
        }
        t.add({r.info.tenant.empty() ? r.info.id : r.key, r.node.empty() ? kUnknown : r.node,
               std::to_string(r.info.turns), std::to_string(r.info.tokens),
               kv && !r.kv.policy.empty() ? r.kv.policy : kUnknown,
               kv ? fixed3(r.kv.keep_ratio) : kUnknown, decode,
               kv ? bytes_or_unknown(r.kv.host_bytes) : kUnknown,
               kv ? bytes_or_unknown(r.kv.disk_bytes) : kUnknown, human_age(r.last_use_unix, now),
               r.ttl_left_seconds < 0 ? kUnknown : human_age(now - r.ttl_left_seconds, now),
               kUnknown});
    }
    if (t.rows() == 0) {
        std::fprintf(stderr, "No sessions on %s.\n", c.server.c_str());
        return 0;
    }
    t.print();
    return 0;
}

int print_live_tiers(const std::vector<api::NodeStats>& nodes, const Common& c) {
    const auto mean_ms = [](const decode::LatencyHistogram& h) {
        return h.count > 0 ? json(1000.0 * h.sum / static_cast<double>(h.count)) : json();
    };
    if (c.as_json) {
        json out = json::array();
        for (const auto& n : nodes) {
            const decode::TierStats& t = n.stats.tiers;
            json j = {{"node", n.name}};
            if (!n.status.ok()) {
                j["error"] = n.status.message();
                out.push_back(std::move(j));
                continue;
            }
            j["decode"] = {{"bytes", n.stats.kv_bytes},
                           {"capacity", n.stats.kv_memory > 0 ? json(n.stats.kv_memory) : json()},
                           {"sessions", n.stats.sessions}};
            j["host"] = {{"bytes", t.host_bytes},
                         {"capacity", t.host_capacity},
                         {"blocks", t.host_blocks},
                         {"leases", t.host_leases}};
            j["disk"] = {{"bytes", t.disk_bytes},
                         {"capacity", t.disk_capacity > 0 ? json(t.disk_capacity) : json()},
                         {"blocks", t.disk_blocks},
                         {"admitting", t.disk_admitting},
                         {"dropped", t.disk_dropped},
                         {"io_errors", t.disk_io_errors},
                         {"recovery_ms", t.disk_recovery_ms}};
            j["sessions_demoted"] = t.sessions_demoted;
            j["promoted"] = {{"host", t.promoted_host}, {"disk", t.promoted_disk}};
            j["promoted_tokens"] = t.promoted_tokens;
            j["prefixes"] = {{"host", t.prefix_host}, {"disk", t.prefix_disk}};
            j["misses"] = {{"missing", t.blocks_missing}, {"refused", t.blocks_refused}};
            j["sessions_persisted"] = t.sessions_persisted;
            j["persist_failed"] = t.persist_failed;
            j["bytes_written"] = t.bytes_written;
            j["store_ms_mean"] = mean_ms(t.store_seconds);
            j["load_ms_mean"] = mean_ms(t.load_seconds);
            out.push_back(std::move(j));
        }
        std::printf("%s\n", out.dump(2).c_str());
        return 0;
    }
    Table t({"NODE", "TIER", "CAPACITY", "USED", "BLOCKS", "SESSIONS", "PROMOTED", "DEMOTED",
             "HEALTH"});
    Table m({"NODE", "MISSES: GONE", "REFUSED", "PREFIXES", "STORED TURNS", "FAILED", "WRITTEN",
             "STORE MS", "LOAD MS"});
    const auto ms = [&](const decode::LatencyHistogram& h) {
        const json v = mean_ms(h);
        return v.is_null() ? std::string(kUnknown) : fixed3(v.get<double>()).substr(0, 6);
    };
    for (const auto& n : nodes) {
        if (!n.status.ok()) {
            t.add({n.name, kUnknown, kUnknown, kUnknown, kUnknown, kUnknown, kUnknown, kUnknown,
                   "unreachable: " + n.status.message()});
            continue;
        }
        const decode::TierStats& s = n.stats.tiers;
        const auto cap = [](int64_t b) {
            return b > 0 ? human_bytes(static_cast<uint64_t>(b)) : std::string(kUnknown);
        };
        const auto num = [](int64_t v) { return std::to_string(v); };
        t.add({n.name, "decode", cap(n.stats.kv_memory),
               human_bytes(static_cast<uint64_t>(n.stats.kv_bytes)), kUnknown,
               num(n.stats.sessions), kUnknown, kUnknown, "ok"});
        t.add({n.name, "host", cap(s.host_capacity),
               human_bytes(static_cast<uint64_t>(s.host_bytes)), num(s.host_blocks), kUnknown,
               num(s.promoted_host), num(s.sessions_demoted), "ok"});
        std::string health = "admitting";
        if (s.disk_capacity == 0) {
            health = "none";
        } else if (!s.disk_admitting) {
            health = "not admitting (" + num(s.disk_io_errors) + " I/O errors)";
        }
        t.add({n.name, "disk", cap(s.disk_capacity),
               human_bytes(static_cast<uint64_t>(s.disk_bytes)), num(s.disk_blocks), kUnknown,
               num(s.promoted_disk), kUnknown, health});
        m.add({n.name, std::to_string(s.blocks_missing), std::to_string(s.blocks_refused),
               std::to_string(s.prefix_host + s.prefix_disk), std::to_string(s.sessions_persisted),
               std::to_string(s.persist_failed),
               human_bytes(static_cast<uint64_t>(s.bytes_written)), ms(s.store_seconds),
               ms(s.load_seconds)});
    }
    t.print();
    std::printf("\n");
    m.print();
    return 0;
}

}  // namespace

int sessions_main(int argc, char** argv) {
    Common c;
    std::string sort_by = "last-use", tenant, node;
    ArgParser p("deltactl sessions",
                "Lists the sessions a store holds: one row each (--json: every field).");
    add_common(p, c);
    p.add("sort-by", &sort_by, "last-use, tokens, turns, bytes or name");
    p.add("tenant", &tenant, "only this tenant's sessions");
    p.add("node", &node, "only the sessions on this node");
    int32_t page_size = 500;
    p.add("page-size", &page_size, "--server: sessions asked for per call");
    if (auto code = parse_flags(p, argc, argv)) return *code;
    init_logging("warn");
    if (sort_by != "last-use" && sort_by != "tokens" && sort_by != "turns" && sort_by != "bytes" &&
        sort_by != "name")
        return usage_error("--sort-by must be last-use, tokens, turns, bytes or name");
    if (page_size < 1 || page_size > api::kMaxSessionPage)
        return usage_error("--page-size must be in [1, " + std::to_string(api::kMaxSessionPage) +
                           "]");
    int code = 0;
    if (c.live()) {
        auto live = connect_live(c, &code);
        if (!live) return code;
        auto rows = live->sessions(page_size);
        if (!rows.ok()) return store_error(rows.status());
        return print_live_sessions(std::move(*rows), c, sort_by,
                                   p.given("tenant") ? &tenant : nullptr,
                                   p.given("node") ? &node : nullptr);
    }
    auto view = open_view(c, &code);
    if (!view) return code;
    std::vector<StoredSession> all = view->sessions();
    std::erase_if(all, [&](const StoredSession& s) {
        return (p.given("tenant") && s.tenant != tenant) || (p.given("node") && s.node != node);
    });
    std::stable_sort(all.begin(), all.end(), [&](const StoredSession& a, const StoredSession& b) {
        if (sort_by == "tokens") return a.tokens > b.tokens;
        if (sort_by == "turns") return a.turns > b.turns;
        if (sort_by == "bytes") return a.disk_bytes > b.disk_bytes;
        if (sort_by == "name") return a.key < b.key;
        return a.last_used > b.last_used;
    });
    if (view->unreadable_records() > 0) {
        std::fprintf(stderr, "deltactl: warning: %lld records do not parse (deltactl verify)\n",
                     static_cast<long long>(view->unreadable_records()));
    }
    // The policy and keep ratio: from each session's first block header.
    std::map<std::string, std::pair<std::string, double>> policy;
    std::map<uint64_t, const BlockHead*> heads;
    const std::vector<BlockHead> blocks = view->blocks();
    for (const auto& h : blocks) heads[h.entry.key] = &h;
    for (const auto& s : all) {
        if (!s.has_kv_record || s.record.keys.empty()) continue;
        auto it = heads.find(s.record.keys[0]);
        if (it == heads.end() || !it->second->meta) continue;
        const kvstore::KvBlockMeta& m = *it->second->meta;
        // Bytes per token of full KV's fp16 rows, from a full layer's part (K and V rows).
        double full_token = NAN;
        for (int32_t l = 0; l < m.n_layers() && std::isnan(full_token); ++l) {
            if (std::isnan(m.layer_error[static_cast<size_t>(l)]) && m.end > m.begin)
                full_token = static_cast<double>(m.part_bytes[static_cast<size_t>(l)]) /
                             (m.end - m.begin) * m.n_layers();
        }
        const double keep = s.record.tokens.empty() || std::isnan(full_token)
                                ? NAN
                                : static_cast<double>(s.disk_bytes) /
                                      (full_token * static_cast<double>(s.record.tokens.size()));
        policy[s.key] = {codec_name(m.codec), keep};
    }
    if (c.as_json) {
        json out = json::array();
        for (const auto& s : all) {
            json j = session_json(s);
            auto it = policy.find(s.key);
            j["policy"] = it != policy.end() ? json(it->second.first) : json();
            j["keep_ratio"] = it != policy.end() ? or_null(it->second.second) : json();
            out.push_back(std::move(j));
        }
        std::printf("%s\n", out.dump(2).c_str());
        return 0;
    }
    Table t({"SESSION", "NODE", "TURNS", "TOKENS", "POLICY", "KEEP", "DECODE", "HOST", "DISK",
             "LAST USE", "TTL LEFT", "PINNED"});
    const int64_t now = unix_now();
    for (const auto& s : all) {
        auto it = policy.find(s.key);
        t.add({s.name(), s.has_gateway_record && !s.node.empty() ? s.node : kUnknown,
               or_unknown(s.turns), or_unknown(s.tokens),
               it != policy.end() ? it->second.first : kUnknown,
               it != policy.end() ? fixed3(it->second.second) : kUnknown, kUnknown, kUnknown,
               s.has_kv_record ? human_bytes(s.disk_bytes) : kUnknown, human_age(s.last_used, now),
               kUnknown, kUnknown});
    }
    if (t.rows() == 0) {
        std::fprintf(stderr, "No sessions in %s.\n", c.data_dir.c_str());
        return 0;
    }
    t.print();
    return 0;
}

int session_main(int argc, char** argv) {
    // deltactl session describe ID [flags]
    if (argc < 1 || std::string(argv[0]) != "describe")
        return usage_error("usage: deltactl session describe ID [flags]");
    std::string id;
    if (argc >= 2 && argv[1][0] != '-') {
        id = argv[1];
        argc -= 2, argv += 2;
    } else {
        argc -= 1, argv += 1;
    }
    Common c;
    ArgParser p("deltactl session describe ID",
                "Everything about one session: its records, each layer's tokens by kind, bytes "
                "and reconstruction error, and its blocks with their checks.");
    add_common(p, c);
    if (auto code = parse_flags(p, argc, argv)) return *code;
    if (id.empty())
        return usage_error("deltactl session describe: which session? (ID or TENANT/ID)");
    if (int code = offline_only(c, "deltactl session describe")) return code;
    init_logging("warn");
    int code = 0;
    auto view = open_view(c, &code);
    if (!view) return code;
    auto s = view->session(id);
    if (!s.ok()) return store_error(s.status());
    const Described d = s->has_kv_record ? describe_blocks(*view, *s) : Described{};
    if (c.as_json) {
        json j = session_json(*s);
        j["policy"] = d.policy == kUnknown ? json() : json(d.policy);
        j["keep_ratio"] = or_null(d.keep);
        json layers = json::array();
        for (size_t l = 0; l < d.layers.size(); ++l) {
            const LayerSum& L = d.layers[l];
            layers.push_back({{"layer", l},
                              {"role", L.full ? "full" : "sparse"},
                              {"sinks", L.sinks},
                              {"references", L.references},
                              {"latents", L.latents},
                              {"buffer", L.buffer},
                              {"exact_bytes", L.exact_bytes},
                              {"latent_bytes", L.latent_bytes},
                              {"error", or_null(L.error())}});
        }
        json blocks = json::array();
        for (const auto& b : d.blocks) {
            blocks.push_back({{"key", hex64(b.key)},
                              {"begin", b.begin},
                              {"end", b.end},
                              {"bytes", b.held ? json(b.bytes) : json()},
                              {"tiers", b.held ? json::array({"disk"}) : json::array()},
                              {"check", b.check},
                              {"error", or_null(b.error)}});
        }
        json turns = json::array();
        int32_t prev = 0;
        for (int32_t e : s->record.turn_ends) {
            turns.push_back({{"begin", prev}, {"end", e}});
            prev = e;
        }
        j["turn_list"] = std::move(turns);
        j["layers"] = std::move(layers);
        j["block_list"] = std::move(blocks);
        std::printf("%s\n", j.dump(2).c_str());
        return 0;
    }
    const int64_t now = unix_now();
    const auto line = [](const char* k, const std::string& v) {
        std::printf("%-13s %s\n", k, v.c_str());
    };
    line("Session:", s->name());
    line("Tenant:", s->tenant.empty() ? "(none)" : s->tenant);
    line("Node:", s->has_gateway_record && !s->node.empty() ? s->node : kUnknown);
    line("Store:", s->store != nullptr ? s->store->dir : kUnknown);
    line("Fingerprint:", s->has_kv_record ? short_hash(s->fingerprint) : kUnknown);
    line("Turns:", or_unknown(s->turns));
    line("Messages:", or_unknown(s->messages));
    line("Tokens:",
         or_unknown(s->tokens) + (s->has_kv_record
                                      ? " (" + std::to_string(s->record.tokens.size()) +
                                            " stored in " + std::to_string(s->record.keys.size()) +
                                            " blocks, " + std::to_string(s->blocks_held) + " held)"
                                      : " (no KV stored)"));
    line("Last use:", s->last_used > 0
                          ? utc(s->last_used) + " (" + human_age(s->last_used, now) + " ago)"
                          : kUnknown);
    line("Policy:", d.policy);
    line("On disk:", s->has_kv_record ? human_bytes(s->disk_bytes) + " (keep " + fixed3(d.keep) +
                                            " of full KV's fp16 bytes)"
                                      : kUnknown);
    line("In memory:", "-- (offline)");
    if (!s->record.turn_ends.empty()) {
        std::printf("\nTurns:\n");
        Table t({"TURN", "TOKENS", "COUNT"});
        int32_t prev = 0;
        for (size_t i = 0; i < s->record.turn_ends.size(); ++i) {
            const int32_t e = s->record.turn_ends[i];
            t.add({std::to_string(i + 1), std::to_string(prev) + "-" + std::to_string(e),
                   std::to_string(e - prev)});
            prev = e;
        }
        t.print();
    }
    if (!d.layers.empty()) {
        std::printf("\nLayers:\n");
        Table t({"LAYER", "ROLE", "EXACT", "SINKS", "REFERENCES", "BUFFER", "LATENTS", "BYTES",
                 "ERROR"});
        for (size_t l = 0; l < d.layers.size(); ++l) {
            const LayerSum& L = d.layers[l];
            const auto kind = [&](int64_t n) { return L.full ? kUnknown : std::to_string(n); };
            t.add({std::to_string(l), L.full ? "full" : "sparse",
                   std::to_string(L.sinks + L.references + L.buffer), kind(L.sinks),
                   kind(L.references), kind(L.buffer), L.full ? "0" : std::to_string(L.latents),
                   human_bytes(L.exact_bytes + L.latent_bytes), fixed3(L.error())});
        }
        t.print();
    }
    if (!d.blocks.empty()) {
        std::printf("\nBlocks:\n");
        Table t({"BLOCK", "KEY", "TOKENS", "BYTES", "TIERS", "CHECK", "ERROR"});
        for (size_t i = 0; i < d.blocks.size(); ++i) {
            const BlockRow& b = d.blocks[i];
            t.add({std::to_string(i), short_hash(b.key),
                   std::to_string(b.begin) + "-" + std::to_string(b.end),
                   b.held ? human_bytes(b.bytes) : kUnknown, b.held ? "disk" : kUnknown, b.check,
                   fixed3(b.error)});
        }
        t.print();
    }
    return 0;
}

int blocks_main(int argc, char** argv) {
    Common c;
    std::string session;
    bool shared = false;
    ArgParser p("deltactl blocks",
                "Lists stored blocks: their tokens, codec, bytes, the sessions that name them, "
                "their age; and what prefix sharing saves.");
    add_common(p, c);
    p.add("session", &session, "only the blocks of this session (ID or TENANT/ID)");
    p.add_switch("shared", &shared, "only blocks more than one session names");
    if (auto code = parse_flags(p, argc, argv)) return *code;
    if (int code = offline_only(c, "deltactl blocks")) return code;
    init_logging("warn");
    int code = 0;
    auto view = open_view(c, &code);
    if (!view) return code;
    std::map<uint64_t, int32_t> named;  // key -> sessions naming it
    std::set<uint64_t> wanted;
    const auto all = view->sessions();
    for (const auto& s : all) {
        for (uint64_t k : s.record.keys) ++named[k];
    }
    if (p.given("session")) {
        auto s = view->session(session);
        if (!s.ok()) return store_error(s.status());
        wanted.insert(s->record.keys.begin(), s->record.keys.end());
    }
    const int64_t now = unix_now();
    uint64_t total = 0, saved = 0;
    size_t count = 0;
    json out = json::array();
    Table t({"KEY", "NODE", "TOKENS", "CODEC", "BYTES", "SESSIONS", "AGE", "HEADER"});
    for (const auto& h : view->blocks()) {
        const int32_t refs = named.count(h.entry.key) ? named[h.entry.key] : 0;
        if (p.given("session") && !wanted.count(h.entry.key)) continue;
        if (shared && refs < 2) continue;
        ++count;
        total += h.entry.bytes;
        if (refs > 1) saved += static_cast<uint64_t>(refs - 1) * h.entry.bytes;
        const bool ok = h.meta.has_value();
        if (c.as_json) {
            out.push_back({{"key", hex64(h.entry.key)},
                           {"node", h.store->name},
                           {"begin", ok ? json(h.meta->begin) : json()},
                           {"end", ok ? json(h.meta->end) : json()},
                           {"codec", ok ? json(codec_name(h.meta->codec)) : json()},
                           {"bytes", h.entry.bytes},
                           {"sessions", refs},
                           {"mtime", h.entry.mtime_s > 0 ? json(h.entry.mtime_s) : json()},
                           {"header", ok ? "ok" : h.fault}});
            continue;
        }
        t.add({short_hash(h.entry.key), node_of(h.store),
               ok ? std::to_string(h.meta->begin) + "-" + std::to_string(h.meta->end) : kUnknown,
               ok ? codec_name(h.meta->codec) : kUnknown, human_bytes(h.entry.bytes),
               std::to_string(refs), human_age(h.entry.mtime_s, now), ok ? "ok" : h.fault});
    }
    if (c.as_json) {
        std::printf("%s\n", json({{"blocks", std::move(out)},
                                  {"count", count},
                                  {"bytes", total},
                                  {"bytes_saved_by_sharing", saved}})
                                .dump(2)
                                .c_str());
        return 0;
    }
    if (count == 0) {
        std::fprintf(stderr, "No blocks.\n");
        return 0;
    }
    t.print();
    std::printf("\n%zu blocks, %s; blocks shared by several sessions save %s.\n", count,
                human_bytes(total).c_str(), human_bytes(saved).c_str());
    return 0;
}

int tiers_main(int argc, char** argv) {
    Common c;
    ArgParser p("deltactl tiers",
                "Each tier's capacity and use, and the disk tier's index (RocksDB's figures).");
    add_common(p, c);
    if (auto code = parse_flags(p, argc, argv)) return *code;
    init_logging("warn");
    int code = 0;
    if (c.live()) {
        auto live = connect_live(c, &code);
        if (!live) return code;
        auto nodes = live->nodes();
        if (!nodes.ok()) return store_error(nodes.status());
        return print_live_tiers(*nodes, c);
    }
    auto view = open_view(c, &code);
    if (!view) return code;
    json out = json::array();
    Table t({"NODE", "TIER", "CAPACITY", "USED", "BLOCKS", "KV RECORDS", "SESSION RECORDS",
             "LOST AT OPEN"});
    Table idx({"NODE", "INDEX PROPERTY", "VALUE"});
    for (const auto& store : view->stores()) {
        const auto st = store->tier->stats();
        auto ds = store->tier->records("ds/");
        auto gw = store->tier->records("gw/");
        const size_t kv_records = ds.ok() ? ds->size() : 0, gw_records = gw.ok() ? gw->size() : 0;
        const auto props = store->tier->index_properties();
        if (c.as_json) {
            json pj = json::object();
            for (const auto& [k, v] : props) pj[k] = v;
            out.push_back({{"node", store->name},
                           {"dir", store->dir},
                           {"tier", "disk"},
                           {"capacity", json()},
                           {"bytes", st.bytes},
                           {"blocks", st.blocks},
                           {"kv_records", kv_records},
                           {"session_records", gw_records},
                           {"entries_lost", st.entries_lost},
                           {"recovery_ms", st.recovery_ms},
                           {"index", std::move(pj)}});
            continue;
        }
        t.add({node_of(store.get()), "disk", kUnknown, human_bytes(st.bytes),
               std::to_string(st.blocks), std::to_string(kv_records), std::to_string(gw_records),
               std::to_string(st.entries_lost)});
        t.add({node_of(store.get()), "host", kUnknown, kUnknown, kUnknown, kUnknown, kUnknown,
               kUnknown});
        for (const auto& [k, v] : props) idx.add({node_of(store.get()), k, std::to_string(v)});
    }
    if (c.as_json) {
        std::printf("%s\n", out.dump(2).c_str());
        return 0;
    }
    t.print();
    std::printf("\n");
    idx.print();
    std::printf(
        "\n(Offline: capacities and the host tier are a running server's; its hits, "
        "misses, promotions and demotions are in its /metrics.)\n");
    return 0;
}

int verify_main(int argc, char** argv) {
    Common c;
    bool drop = false;
    ArgParser p("deltactl verify",
                "Reads every stored block and record and checks it (sizes, checksums, keys, "
                "the records' checksums of their blocks). Changes nothing unless --drop. Exit "
                "code 1 when anything is bad.");
    add_common(p, c);
    p.add_switch("drop", &drop, "remove what is bad (a stopped node's store only)");
    if (auto code = parse_flags(p, argc, argv)) return *code;
    if (int code = offline_only(c, "deltactl verify")) return code;
    init_logging("warn");
    int code = 0;
    auto view = open_view(c, &code, drop);
    if (!view) return code;
    struct Problem {
        const Store* store;
        std::string what, name, problem;
    };
    std::vector<Problem> problems;
    std::map<const Store*, std::set<uint64_t>> bad_blocks;
    uint64_t blocks = 0, bytes = 0, records = 0;
    std::map<const Store*, std::map<uint64_t, uint32_t>> crc_of;
    for (const auto& store : view->stores()) {
        for (const auto& e : store->tier->blocks()) {
            ++blocks;
            auto data = view->read_block(*store, e.key);
            std::string fault;
            if (data.ok()) {
                bytes += data->size();
                auto v = parse_any_block(*data, &fault);
                if (v.ok() && v->meta.key != e.key) fault = "key: stored under another key";
                if (v.ok() && fault.empty()) crc_of[store.get()][e.key] = crc32c(*data);
            } else {
                fault = data.status().message();
            }
            if (!fault.empty()) {
                problems.push_back({store.get(), "block", hex64(e.key), fault});
                bad_blocks[store.get()].insert(e.key);
            }
        }
        for (const char* prefix : {"ds/", "gw/"}) {
            auto recs = store->tier->records(prefix);
            if (!recs.ok()) {
                problems.push_back({store.get(), "index", prefix, recs.status().message()});
                continue;
            }
            for (const auto& [k, v] : *recs) {
                ++records;
                std::string problem;
                if (prefix[0] == 'd') {
                    auto r = decode::decode_session_record(v);
                    if (!r) {
                        problem = "does not parse";
                    } else {
                        for (size_t i = 0; i < r->keys.size() && problem.empty(); ++i) {
                            auto it = crc_of[store.get()].find(r->keys[i]);
                            if (it != crc_of[store.get()].end() && r->crcs[i] != 0 &&
                                r->crcs[i] != it->second)
                                problem = "block " + std::to_string(i) +
                                          "'s checksum is another export's";
                        }
                    }
                } else {
                    try {
                        const auto j = json::parse(v);
                        (void)j.at("id").get<std::string>();
                        (void)j.at("history").size();
                    } catch (const std::exception& ex) {
                        problem = "does not parse";
                    }
                }
                if (!problem.empty()) problems.push_back({store.get(), "record", k, problem});
            }
        }
    }
    int64_t dropped = 0;
    if (drop) {
        for (const auto& pr : problems) {
            if (pr.what == "block") {
                pr.store->tier->erase(std::stoull(pr.name, nullptr, 16), true);
                ++dropped;
            } else if (pr.what == "record") {
                const kvstore::DiskTier::Record del[] = {{pr.name, ""}};
                if (pr.store->tier->put_records(del).ok()) ++dropped;
            }
        }
    }
    if (c.as_json) {
        json list = json::array();
        for (const auto& pr : problems)
            list.push_back({{"node", pr.store->name},
                            {"kind", pr.what},
                            {"name", pr.what == "block" ? pr.name : pr.name},
                            {"problem", pr.problem}});
        std::printf("%s\n", json({{"blocks", blocks},
                                  {"bytes", bytes},
                                  {"records", records},
                                  {"bad", problems.size()},
                                  {"dropped", dropped},
                                  {"problems", std::move(list)}})
                                .dump(2)
                                .c_str());
    } else {
        if (!problems.empty()) {
            Table t({"NODE", "KIND", "NAME", "PROBLEM"});
            for (const auto& pr : problems)
                t.add({node_of(pr.store), pr.what,
                       pr.what == "block" ? pr.name.substr(0, 12) : pr.name, pr.problem});
            t.print();
            std::printf("\n");
        }
        std::printf("Checked %llu blocks (%s) and %llu records: %zu bad%s.\n",
                    static_cast<unsigned long long>(blocks), human_bytes(bytes).c_str(),
                    static_cast<unsigned long long>(records), problems.size(),
                    drop ? (", " + std::to_string(dropped) + " dropped").c_str() : "");
    }
    return problems.empty() ? 0 : 1;
}

int cluster_main(int argc, char** argv) {
    Common c;
    ArgParser p("deltactl cluster",
                "The gateway and every node behind it: roles, addresses, versions, load, sessions "
                "and tier use (a running server's admin service).");
    add_common(p, c);
    if (auto code = parse_flags(p, argc, argv)) return *code;
    init_logging("warn");
    if (!c.live())
        return usage_error(
            "deltactl cluster asks a running server: give --server HOST:PORT or "
            "--config cluster.yaml");
    int code = 0;
    auto live = connect_live(c, &code);
    if (!live) return code;
    auto v = live->cluster();
    if (!v.ok()) return store_error(v.status());
    if (c.as_json) {
        json decode = json::array(), prefill = json::array();
        for (const auto& n : v->decode) {
            json j = {{"name", n.name},
                      {"rpc_address", n.rpc_address},
                      {"data_address", n.data_address},
                      {"version", n.version},
                      {"ok", n.status.ok()}};
            if (!n.status.ok()) {
                j["error"] = n.status.message();
            } else {
                j["sessions"] = n.stats.sessions;
                j["running"] = n.stats.running;
                j["waiting"] = n.stats.waiting;
                j["kv_bytes"] = n.stats.kv_bytes;
                j["kv_memory"] = n.stats.kv_memory;
                j["host_bytes"] = n.stats.tiers.host_bytes;
                j["disk_bytes"] = n.stats.tiers.disk_bytes;
            }
            decode.push_back(std::move(j));
        }
        for (const auto& n : v->prefill) {
            json j = {{"name", n.name},
                      {"rpc_address", n.rpc_address},
                      {"version", n.version},
                      {"ok", n.status.ok()}};
            if (!n.status.ok()) {
                j["error"] = n.status.message();
            } else {
                j["queued"] = n.stats.queued;
                j["requests"] = n.stats.requests;
                j["tokens"] = n.stats.tokens;
                j["bytes_shipped"] = n.stats.bytes_shipped;
            }
            prefill.push_back(std::move(j));
        }
        std::printf("%s\n", json({{"gateway",
                                   {{"address", c.server.empty() ? json() : json(c.server)},
                                    {"version", v->version},
                                    {"model", v->model_id}}},
                                  {"decode", std::move(decode)},
                                  {"prefill", std::move(prefill)}})
                                .dump(2)
                                .c_str());
        return 0;
    }
    Table t({"NODE", "ROLE", "ADDRESS", "DATA", "VERSION", "STATE", "LOAD", "SESSIONS", "KV",
             "HOST", "DISK"});
    t.add({"gateway", "gateway", c.server.empty() ? kUnknown : c.server, kUnknown, v->version, "ok",
           kUnknown, kUnknown, kUnknown, kUnknown, kUnknown});
    for (const auto& n : v->decode) {
        if (!n.status.ok()) {
            t.add({n.name, "decode", n.rpc_address, n.data_address,
                   n.version.empty() ? kUnknown : n.version, "unreachable", kUnknown, kUnknown,
                   kUnknown, kUnknown, kUnknown});
            continue;
        }
        const auto& s = n.stats;
        t.add({n.name, "decode", n.rpc_address, n.data_address.empty() ? kUnknown : n.data_address,
               n.version, "ok",
               std::to_string(s.running) + " running, " + std::to_string(s.waiting) + " waiting",
               std::to_string(s.sessions),
               human_bytes(static_cast<uint64_t>(s.kv_bytes)) + " / " +
                   (s.kv_memory > 0 ? human_bytes(static_cast<uint64_t>(s.kv_memory)) : kUnknown),
               human_bytes(static_cast<uint64_t>(s.tiers.host_bytes)),
               s.tiers.disk_capacity > 0 ? human_bytes(static_cast<uint64_t>(s.tiers.disk_bytes))
                                         : kUnknown});
    }
    for (const auto& n : v->prefill) {
        t.add({n.name, "prefill", n.rpc_address, kUnknown, n.version.empty() ? kUnknown : n.version,
               n.status.ok() ? "ok" : "unreachable",
               n.status.ok() ? std::to_string(n.stats.queued) + " queued" : kUnknown, kUnknown,
               kUnknown, kUnknown, kUnknown});
    }
    std::printf("Model: %s\n\n", v->model_id.c_str());
    t.print();
    return 0;
}

int checkpoint_main(int argc, char** argv) {
    Common c;
    std::string name;
    ArgParser p("deltactl checkpoint",
                "Has a running server copy its stores (RocksDB's hard-link checkpoint and links "
                "to the payload files) under <data dir>/checkpoints/NAME, which the offline "
                "views then read while it runs.");
    add_common(p, c);
    p.add("name", &name, "the checkpoint's name (default: the time, UTC)");
    if (auto code = parse_flags(p, argc, argv)) return *code;
    init_logging("warn");
    if (!c.live())
        return usage_error(
            "deltactl checkpoint asks a running server: give --server HOST:PORT "
            "or --config cluster.yaml");
    if (name.empty()) {
        const std::time_t t = std::time(nullptr);
        std::tm tm{};
        gmtime_r(&t, &tm);
        char buf[32];
        std::strftime(buf, sizeof(buf), "%Y%m%dT%H%M%SZ", &tm);
        name = buf;
    }
    int code = 0;
    auto live = connect_live(c, &code);
    if (!live) return code;
    auto paths = live->checkpoint(name);
    if (!paths.ok()) {
        return paths.status().code() == StatusCode::kInvalidArgument
                   ? usage_error(paths.status().message())
                   : store_error(paths.status());
    }
    if (c.as_json) {
        std::printf("%s\n", json({{"name", name}, {"paths", *paths}}).dump(2).c_str());
        return 0;
    }
    for (const auto& path : *paths) std::printf("%s\n", path.c_str());
    if (!paths->empty()) {
        // The data dir's layout: .../checkpoints/NAME/[node/]kv.
        fs::path root = fs::path(paths->front()).parent_path();
        if (paths->size() > 1 || root.filename() != name) root = root.parent_path();
        std::fprintf(stderr, "read it with: deltactl sessions --data-dir %s\n", root.c_str());
    }
    return 0;
}

// deltactl drop|evict ID: an operator's act on one session of a running server.
int act_main(const char* verb, int argc, char** argv) {
    const std::string command = std::string("deltactl ") + verb;
    std::string id;
    if (argc >= 1 && argv[0][0] != '-') {
        id = argv[0];
        --argc, ++argv;
    }
    Common c;
    ArgParser p(command + " ID",
                std::string(verb) == "drop"
                    ? "Forgets a session on a running server: its history and its KV wherever it "
                      "is (as its owner closing it)."
                    : "Takes an idle session's KV out of decode memory into the host and disk "
                      "tiers on a running server; its next turn takes it back.");
    add_common(p, c);
    if (auto code = parse_flags(p, argc, argv)) return *code;
    init_logging("warn");
    if (id.empty()) return usage_error(command + ": which session? (ID or TENANT/ID)");
    if (!c.live())
        return usage_error(command +
                           " acts on a running server: give --server HOST:PORT or "
                           "--config cluster.yaml");
    int code = 0;
    auto live = connect_live(c, &code);
    if (!live) return code;
    // ID alone names the session of that id when one tenant has it (as the views do).
    std::string tenant, sid = id;
    if (const size_t slash = id.rfind('/'); slash != std::string::npos) {
        tenant = id.substr(0, slash);
        sid = id.substr(slash + 1);
    } else {
        auto rows = live->sessions(api::kMaxSessionPage);
        if (!rows.ok()) return store_error(rows.status());
        int matches = 0;
        for (const auto& r : *rows) {
            if (r.info.id == id) {
                tenant = r.info.tenant;
                ++matches;
            }
        }
        if (matches > 1)
            return usage_error("session id " + id + " is held by " + std::to_string(matches) +
                               " tenants: name it as TENANT/ID");
    }
    const Status s =
        std::string(verb) == "drop" ? live->drop(tenant, sid) : live->evict(tenant, sid);
    if (!s.ok()) return store_error(s);
    std::printf("%s %s\n", std::string(verb) == "drop" ? "dropped" : "evicted", id.c_str());
    return 0;
}

int drop_main(int argc, char** argv) { return act_main("drop", argc, argv); }
int evict_main(int argc, char** argv) { return act_main("evict", argc, argv); }

// Why a stored block of a session would not be taken by its next turn.
std::string miss_reason(const std::string& check) {
    if (check == "missing")
        return "not in the disk tier: evicted by its cap (least recently written first), or "
               "dropped as bad";
    if (check == "checksum") return "checksum failed: a node refuses it and recomputes";
    if (check == "another export")
        return "another export of the session than its record names: refused";
    if (check == "fingerprint") return "made for another model, tokenizer or profile";
    if (check == "unreadable") return "its file cannot be read";
    return check + ": refused";
}

int explain_main(int argc, char** argv) {
    std::string id;
    if (argc >= 1 && argv[0][0] != '-') {
        id = argv[0];
        --argc, ++argv;
    }
    Common c;
    ArgParser p("deltactl explain ID",
                "What the session's next turn would take from the stored tiers, block by block, "
                "and why each block that would not be taken is not (a stopped node's store, or "
                "a checkpoint of a running one).");
    add_common(p, c);
    if (auto code = parse_flags(p, argc, argv)) return *code;
    if (int code = offline_only(c, "deltactl explain")) return code;
    init_logging("warn");
    if (id.empty()) return usage_error("deltactl explain: which session? (ID or TENANT/ID)");
    int code = 0;
    auto view = open_view(c, &code);
    if (!view) return code;
    auto s = view->session(id);
    if (!s.ok()) return store_error(s.status());
    json out = {{"session", s->name()}};
    std::vector<std::string> others;
    for (uint64_t fp : s->other_fingerprints) others.push_back(hex64(fp));
    out["other_fingerprints"] = others;
    if (!s->has_kv_record) {
        out["stored"] = false;
        out["reason"] =
            "never stored: no KV record (a server without a data dir, or no turn of it ended)";
        out["blocks"] = json::array();
    } else {
        const Described d = describe_blocks(*view, *s);
        json blocks = json::array();
        int64_t taken_tokens = 0;
        bool broken = false;
        size_t taken = 0;
        for (size_t i = 0; i < d.blocks.size(); ++i) {
            const BlockRow& b = d.blocks[i];
            json j = {{"block", i},
                      {"key", hex64(b.key)},
                      {"begin", b.begin},
                      {"end", b.end},
                      {"check", b.check}};
            if (broken) {
                j["taken"] = false;
                j["reason"] =
                    "follows a block that is not taken (blocks chain: each needs those before it)";
            } else if (b.check == "ok") {
                j["taken"] = true;
                j["tier"] = "disk";
                taken_tokens = b.end;
                ++taken;
            } else {
                broken = true;
                j["taken"] = false;
                j["reason"] = miss_reason(b.check);
            }
            blocks.push_back(std::move(j));
        }
        out["stored"] = true;
        out["fingerprint"] = hex64(s->fingerprint);
        out["policy"] = d.policy == kUnknown ? json() : json(d.policy);
        out["stored_tokens"] = s->record.tokens.size();
        out["taken_tokens"] = taken_tokens;
        out["taken_blocks"] = taken;
        out["recomputed_tokens"] = static_cast<int64_t>(s->record.tokens.size()) - taken_tokens;
        out["blocks"] = std::move(blocks);
    }
    if (c.as_json) {
        std::printf("%s\n", out.dump(2).c_str());
        return 0;
    }
    std::printf("Session %s", s->name().c_str());
    if (!s->has_kv_record) {
        std::printf(": %s.\n", out["reason"].get<std::string>().c_str());
    } else {
        const int64_t stored = out["stored_tokens"], taken_tokens = out["taken_tokens"];
        const std::string policy = out["policy"].is_null() ? kUnknown : out["policy"];
        std::printf(
            " (%s, fingerprint %s), out of decode memory or after a restart: its next "
            "turn takes %zu of %zu blocks (tokens 0-%lld) from disk",
            policy.c_str(), short_hash(s->fingerprint).c_str(), out["taken_blocks"].get<size_t>(),
            out["blocks"].size(), static_cast<long long>(taken_tokens));
        if (taken_tokens < stored) {
            std::printf(", computes tokens %lld-%lld again", static_cast<long long>(taken_tokens),
                        static_cast<long long>(stored));
        }
        std::printf(", then its new message.\n\n");
        Table t({"BLOCK", "KEY", "TOKENS", "TAKEN", "WHY NOT"});
        for (const json& b : out["blocks"]) {
            t.add(
                {std::to_string(b["block"].get<int>()), b["key"].get<std::string>().substr(0, 12),
                 std::to_string(b["begin"].get<int>()) + "-" + std::to_string(b["end"].get<int>()),
                 b["taken"].get<bool>() ? "disk" : "no",
                 b.contains("reason") ? b["reason"].get<std::string>() : ""});
        }
        t.print();
    }
    if (!others.empty()) {
        std::printf(
            "\nAlso stored under %zu other fingerprint(s) (another model, tokenizer, "
            "profile or policy): a server uses only the records of its own.\n",
            others.size());
    }
    return 0;
}

}  // namespace deltaserve::ops
