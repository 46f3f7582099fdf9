// deltactl's views of a stored cache (store_view.h): sessions, tiers and verify on a stopped
// node's data dir or a checkpoint; sessions and tiers ask a running server instead with
// --server (live_commands.cpp).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "command_support.h"
#include "commands.h"
#include "deltaserve/common/crc32c.h"
#include "deltaserve/common/logging.h"
#include "deltaserve/model/model.h"
#include "live_commands.h"
#include "session_view.h"
#include "table.h"

namespace deltaserve::ops {

int sessions_main(int argc, char** argv) {
    Common c;
    std::string sort_by = "last-use", tenant, node;
    ArgParser p("deltactl sessions",
                "Lists the sessions a store holds: one row each (--json: every field).");
    add_common(p, c);
    add_watch(p, c);
    p.add("sort-by", &sort_by, "last-use, tokens, turns, bytes or name");
    p.add("tenant", &tenant, "only this tenant's sessions");
    p.add("node", &node, "only the sessions on this node");
    int32_t page_size = 500;
    p.add("page-size", &page_size, "--server: sessions asked for per call");
    if (auto code = parse_flags(p, argc, argv)) return *code;
    if (int code = watch_usage(c, "deltactl sessions")) return code;
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
        return watch_loop(c, "deltactl sessions", [&] {
            auto rows = live->sessions(page_size);
            if (!rows.ok()) return store_error(rows.status());
            return print_live_sessions(std::move(*rows), c, sort_by,
                                       p.given("tenant") ? &tenant : nullptr,
                                       p.given("node") ? &node : nullptr);
        });
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
    for (const auto& s : all) {
        if (!s.has_kv_record || s.record.keys.empty()) continue;
        const auto head = view->read_header(*s.store, s.record.keys[0]);
        if (!head.ok()) continue;
        const kvstore::KvBlockMeta& m = *head;
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
    Table t(session_columns());
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

int tiers_main(int argc, char** argv) {
    Common c;
    ArgParser p("deltactl tiers",
                "Each tier's capacity and use, and the disk tier's index (RocksDB's figures).");
    add_common(p, c);
    add_watch(p, c);
    if (auto code = parse_flags(p, argc, argv)) return *code;
    if (int code = watch_usage(c, "deltactl tiers")) return code;
    init_logging("warn");
    int code = 0;
    if (c.live()) {
        auto live = connect_live(c, &code);
        if (!live) return code;
        return watch_loop(c, "deltactl tiers", [&] {
            auto nodes = live->nodes();
            if (!nodes.ok()) return store_error(nodes.status());
            return print_live_tiers(*nodes, c);
        });
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
        // What the index and the payload files disagree on (a running server mends these
        // at its start; a stopped store shows them).
        for (const auto& m : store->tier->mismatches()) {
            problems.push_back({store.get(), m.kind == "orphan" ? "file" : "index",
                                m.file.empty() ? hex64(m.key) : m.file, m.detail});
        }
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
            } else if (pr.what == "file" || pr.what == "index") {
                ++dropped;  // mended by the writable open (orphans and lost entries removed)
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

}  // namespace deltaserve::ops
