// deltactl's live commands, through a running server's admin service (live_admin.h):
// sessions and tiers as they are now, cluster, checkpoint, evict and drop.
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <optional>

#include "cluster_members.h"
#include "command_support.h"
#include "commands.h"
#include "deltaserve/common/logging.h"
#include "live_commands.h"
#include "table.h"

namespace deltaserve::ops {

namespace fs = std::filesystem;

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
                           {"pinned", kv ? json(r.kv.pinned) : json()}});
        }
        std::printf("%s\n", json_text(c, out).c_str());
        return 0;
    }
    Table t(session_columns());
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
               kv ? (r.kv.pinned ? "yes" : "no") : kUnknown});
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
            j["device"] = {{"bytes", t.device_bytes},
                           {"capacity", t.device_capacity > 0 ? json(t.device_capacity) : json()},
                           {"blocks", t.device_blocks}};
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
            j["promoted"] = {{"device", t.promoted_device},
                             {"host", t.promoted_host},
                             {"disk", t.promoted_disk}};
            j["promoted_tokens"] = t.promoted_tokens;
            j["prefixes"] = {
                {"device", t.prefix_device}, {"host", t.prefix_host}, {"disk", t.prefix_disk}};
            j["misses"] = {{"missing", t.blocks_missing}, {"refused", t.blocks_refused}};
            j["sessions_persisted"] = t.sessions_persisted;
            j["persist_failed"] = t.persist_failed;
            j["bytes_written"] = t.bytes_written;
            j["store_ms_mean"] = mean_ms(t.store_seconds);
            j["load_ms_mean"] = mean_ms(t.load_seconds);
            out.push_back(std::move(j));
        }
        std::printf("%s\n", json_text(c, out).c_str());
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
        if (s.device_capacity > 0) {  // a row only where there is a device tier
            t.add({n.name, "device", cap(s.device_capacity),
                   human_bytes(static_cast<uint64_t>(s.device_bytes)), num(s.device_blocks),
                   kUnknown, num(s.promoted_device), kUnknown, "ok"});
        }
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
               std::to_string(s.prefix_device + s.prefix_host + s.prefix_disk),
               std::to_string(s.sessions_persisted), std::to_string(s.persist_failed),
               human_bytes(static_cast<uint64_t>(s.bytes_written)), ms(s.store_seconds),
               ms(s.load_seconds)});
    }
    t.print();
    std::printf("\n");
    m.print();
    return 0;
}

int print_cluster(const api::ClusterView& view, const Common& c,
                  const std::vector<MemberRow>* members);

// The members etcd lists, when --config names etcd; nullopt otherwise (or printed why not).
std::optional<std::vector<MemberRow>> etcd_members(const Common& c) {
    if (c.config.empty()) return std::nullopt;
    auto cfg = api::load_cluster_config(c.config);
    if (!cfg.ok() || cfg->etcd.empty()) return std::nullopt;
    auto rows = read_members(*cfg);
    if (!rows.ok()) {
        std::fprintf(stderr, "deltactl: etcd: %s\n", rows.error().message().c_str());
        return std::nullopt;
    }
    return std::move(*rows);
}

int cluster_main(int argc, char** argv) {
    Common c;
    ArgParser p("deltactl cluster",
                "The gateway and every node behind it: roles, addresses, versions, load, sessions "
                "and tier use (a running server's admin service).");
    add_common(p, c);
    add_watch(p, c);
    if (auto code = parse_flags(p, argc, argv)) return *code;
    if (int code = watch_usage(c, "deltactl cluster")) return code;
    init_logging("warn");
    if (!c.live())
        return usage_error(
            "deltactl cluster asks a running server: give --server HOST:PORT or "
            "--config cluster.yaml");
    int code = 0;
    auto live = connect_live(c, &code);
    if (!live) return code;
    return watch_loop(c, "deltactl cluster", [&] {
        auto v = live->cluster();
        if (!v.ok()) return store_error(v.status());
        const auto members = etcd_members(c);
        return print_cluster(*v, c, members ? &*members : nullptr);
    });
}

json members_json(const std::vector<MemberRow>& rows) {
    json out = json::array();
    for (const MemberRow& m : rows) {
        json j = {{"key", m.key}, {"lease", m.lease}, {"ttl_left", m.ttl_left}};
        if (!m.error.empty()) {
            j["error"] = m.error;
        } else {
            j["role"] = api::member_role_name(m.record.role);
            j["name"] = m.record.name;
            j["rpc"] = m.record.rpc;
            j["data"] = m.record.data;
            j["http"] = m.record.http;
            j["model"] = m.record.model;
            j["version"] = m.record.version;
            j["capacity"] = m.record.capacity;
            j["draining"] = m.record.draining;
            j["started_ms"] = m.record.started_ms;
        }
        out.push_back(std::move(j));
    }
    return out;
}

void print_members(const std::vector<MemberRow>& rows) {
    Table t({"MEMBER", "ROLE", "RPC", "DATA", "VERSION", "STATE", "LEASE", "TTL LEFT"});
    for (const MemberRow& m : rows) {
        const std::string ttl = m.ttl_left < 0 ? "expired" : std::to_string(m.ttl_left) + " s";
        if (!m.error.empty()) {
            t.add({m.key, kUnknown, kUnknown, kUnknown, kUnknown, "not a record",
                   std::to_string(m.lease), ttl});
            continue;
        }
        const api::MemberRecord& r = m.record;
        t.add({r.name, api::member_role_name(r.role), r.rpc.empty() ? r.http : r.rpc,
               r.data.empty() ? kUnknown : r.data, r.version, r.draining ? "draining" : "serving",
               std::to_string(m.lease), ttl});
    }
    std::printf("\nMembers (etcd):\n");
    t.print();
}

int print_cluster(const api::ClusterView& view, const Common& c,
                  const std::vector<MemberRow>* members) {
    const api::ClusterView* v = &view;
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
        std::printf("%s\n",
                    json_text(c, json({{"gateway",
                                        {{"address", c.server.empty() ? json() : json(c.server)},
                                         {"version", v->version},
                                         {"model", v->model_id}}},
                                       {"decode", std::move(decode)},
                                       {"prefill", std::move(prefill)},
                                       {"members", members ? members_json(*members) : json()}}))
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
    if (members) print_members(*members);
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
    const std::string id = take_id(argc, argv);
    Common c;
    const std::string v = verb;
    const char* what =
        v == "drop"    ? "Forgets a session on a running server: its history and its KV wherever "
                         "it is (as its owner closing it)."
        : v == "evict" ? "Takes an idle session's KV out of decode memory into the host and disk "
                         "tiers on a running server; its next turn takes it back."
        : v == "pin"   ? "Keeps a session and its KV in a running server's memory: neither its "
                         "TTL nor the LRU drops it, and a restart brings it back (an evict or a drop "
                         "ends the pin)."
                       : "Lets the TTL and the LRU have a pinned session again.";
    ArgParser p(command + " ID", what);
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
    const Status s = v == "drop"    ? live->drop(tenant, sid)
                     : v == "evict" ? live->evict(tenant, sid)
                                    : live->pin(tenant, sid, v == "pin");
    if (!s.ok()) return store_error(s);
    std::printf("%s %s\n",
                v == "drop"    ? "dropped"
                : v == "evict" ? "evicted"
                : v == "pin"   ? "pinned"
                               : "unpinned",
                id.c_str());
    return 0;
}

int drop_main(int argc, char** argv) { return act_main("drop", argc, argv); }
int evict_main(int argc, char** argv) { return act_main("evict", argc, argv); }
int pin_main(int argc, char** argv) { return act_main("pin", argc, argv); }
int unpin_main(int argc, char** argv) { return act_main("unpin", argc, argv); }

}  // namespace deltaserve::ops
