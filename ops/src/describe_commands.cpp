// deltactl session describe and blocks: one session's stored KV block by block, and the
// blocks of a store, offline on a data dir (store_view.h) or live through a running server's
// admin service (Admin.sessionBlocks and readBlock: the node's record, where each block is
// and who leases it, and the blocks' bytes for the same checks).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include "command_support.h"
#include "commands.h"
#include "deltaserve/common/logging.h"
#include "deltaserve/model/model.h"
#include "session_view.h"
#include "table.h"

namespace deltaserve::ops {

namespace {

// What a running server says of a session beside its stored record.
struct LiveState {
    std::string node;
    api::SessionRow row;
};

std::string tiers_text(const std::vector<std::string>& tiers) {
    std::string out;
    for (const auto& t : tiers) out += (out.empty() ? "" : ",") + t;
    return out.empty() ? std::string(kUnknown) : out;
}

std::string leases_text(const std::vector<decode::StoredBlockPlace::Holder>& leases) {
    if (leases.empty()) return "none";
    std::string out;
    for (const auto& l : leases) {
        char left[32];
        std::snprintf(left, sizeof(left), " (%.0fs)", std::max(0.0, l.seconds_left));
        out += (out.empty() ? "" : ", ") + l.owner + left;
    }
    return out;
}

json leases_json(const std::vector<decode::StoredBlockPlace::Holder>& leases) {
    json out = json::array();
    for (const auto& l : leases)
        out.push_back({{"owner", l.owner}, {"seconds_left", l.seconds_left}});
    return out;
}

void add_live_json(const LiveState& live, json& j) {
    const decode::SessionKv& kv = live.row.kv;
    j["node"] = live.node;
    j["running"] = live.row.info.running;
    j["decode_tokens"] = or_null(kv.tokens);
    j["decode_bytes"] = or_null(kv.decode_bytes);
    j["host_bytes"] = or_null(kv.host_bytes);
    j["pinned"] = kv.pinned;
    j["ttl_left_seconds"] = or_null(live.row.ttl_left_seconds);
}

int print_session(const Common& c, const StoredSession& session, const Described& d,
                  bool tokens_asked, int32_t tb, int32_t te,
                  const std::vector<TokenRow>& token_rows, const std::vector<std::string>& texts,
                  const LiveState* live) {
    const StoredSession* s = &session;
    if (c.as_json) {
        json j = session_json(*s);
        if (live != nullptr) add_live_json(*live, j);
        j["policy"] = d.policy == kUnknown ? json() : json(d.policy);
        j["keep_ratio"] = or_null(d.keep);
        json layers = json::array();
        for (size_t l = 0; l < d.layers.size(); ++l) {
            const LayerSum& L = d.layers[l];
            layers.push_back({{"layer", l},
                              {"role", layer_role(d, l)},
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
                              {"tiers", b.tiers},
                              {"check", b.check},
                              {"error", or_null(b.error)},
                              {"leases", live != nullptr ? leases_json(b.leases) : json()}});
        }
        json turns = json::array();
        int32_t prev = 0;
        for (int32_t e : s->record.turn_ends) {
            turns.push_back({{"begin", prev}, {"end", e}});
            prev = e;
        }
        j["turn_list"] = std::move(turns);
        if (tokens_asked) {
            json tl = json::array();
            for (size_t i = 0; i < token_rows.size(); ++i) {
                tl.push_back({{"position", token_rows[i].position},
                              {"id", token_rows[i].id},
                              {"kind", token_rows[i].kind},
                              {"text", texts.empty() ? json() : json(texts[i])}});
            }
            j["token_list"] = std::move(tl);
        }
        j["layers"] = std::move(layers);
        j["block_list"] = std::move(blocks);
        std::printf("%s\n", json_text(c, j).c_str());
        return 0;
    }
    const int64_t now = unix_now();
    const auto line = [](const char* k, const std::string& v) {
        std::printf("%-13s %s\n", k, v.c_str());
    };
    line("Session:", s->name());
    line("Tenant:", s->tenant.empty() ? "(none)" : s->tenant);
    line("Node:", s->has_gateway_record && !s->node.empty() ? s->node : kUnknown);
    line("Store:", s->store != nullptr ? s->store->dir
                   : live != nullptr   ? "the running node's tiers (" + live->node + ")"
                                       : kUnknown);
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
    if (live == nullptr) {
        line("In memory:", "-- (offline)");
    } else {
        const decode::SessionKv& kv = live->row.kv;
        line("Host tier:", bytes_or_unknown(kv.host_bytes));
        line("In memory:", live->row.info.running ? "a turn is running"
                           : kv.decode_bytes >= 0
                               ? human_bytes(static_cast<uint64_t>(kv.decode_bytes)) + " (" +
                                     std::to_string(kv.tokens) + " tokens in decode memory, keep " +
                                     fixed3(kv.keep_ratio) + ")"
                               : "no (its next turn takes it from the tiers)");
        line("Pinned:", kv.pinned ? "yes" : "no");
        line("TTL left:", live->row.ttl_left_seconds < 0
                              ? kUnknown
                              : human_age(now - live->row.ttl_left_seconds, now));
    }
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
            t.add({std::to_string(l), layer_role(d, l),
                   std::to_string(L.sinks + L.references + L.buffer), kind(L.sinks),
                   kind(L.references), kind(L.buffer), L.full ? "0" : std::to_string(L.latents),
                   human_bytes(L.exact_bytes + L.latent_bytes), fixed3(L.error())});
        }
        t.print();
    }
    if (!token_rows.empty()) {
        std::printf("\nTokens %d-%d:\n", tb, te);
        Table t({"POSITION", "ID", "KIND", "TEXT"});
        for (size_t i = 0; i < token_rows.size(); ++i) {
            std::string text = texts.empty() ? kUnknown : json(texts[i]).dump();
            t.add({std::to_string(token_rows[i].position), std::to_string(token_rows[i].id),
                   token_rows[i].kind, text});
        }
        t.print();
    }
    if (!d.blocks.empty()) {
        std::printf("\nBlocks:\n");
        Table t({"BLOCK", "KEY", "TOKENS", "BYTES", "TIERS", "CHECK", "ERROR", "LEASES"});
        for (size_t i = 0; i < d.blocks.size(); ++i) {
            const BlockRow& b = d.blocks[i];
            t.add({std::to_string(i), short_hash(b.key),
                   std::to_string(b.begin) + "-" + std::to_string(b.end),
                   b.held ? human_bytes(b.bytes) : kUnknown, tiers_text(b.tiers), b.check,
                   fixed3(b.error), live != nullptr ? leases_text(b.leases) : kUnknown});
        }
        t.print();
    }
    return 0;
}

// The session as a running server holds it: its listing row, its node's record and the
// places of its blocks; `read` then reads the blocks from that node.
Result<StoredSession> live_session(LiveAdmin& admin, const std::string& id, LiveState* live,
                                   std::vector<decode::StoredBlockPlace>* places) {
    auto rows = admin.sessions(api::kMaxSessionPage);
    if (!rows.ok()) return rows.status();
    const api::SessionRow* row = nullptr;
    int matches = 0;
    for (const auto& r : *rows) {
        if (r.key == id) {
            row = &r;
            matches = 1;
            break;
        }
        if (r.info.id == id) {
            row = &r;
            ++matches;
        }
    }
    if (matches == 0) return not_found("no session " + id + " on the server");
    if (matches > 1)
        return invalid_argument("session id " + id + " is held by " + std::to_string(matches) +
                                " tenants: name it as TENANT/ID");
    live->row = *row;
    StoredSession s;
    s.key = row->key;
    s.tenant = row->info.tenant;
    s.id = row->info.id;
    s.has_gateway_record = true;
    s.node = row->node;
    s.turns = row->info.turns;
    s.messages = row->info.messages;
    s.tokens = row->info.tokens;
    s.last_used = row->last_use_unix;
    auto blocks = admin.session_blocks(s.tenant, s.id, &live->node);
    if (blocks.status().code() == StatusCode::kNotFound) {
        live->node = row->node;
        return s;  // nothing stored (yet)
    }
    if (!blocks.ok()) return blocks.status();
    auto record = decode::decode_session_record(blocks->record);
    if (!record) return data_loss("the node's record of session " + id + " does not parse");
    s.has_kv_record = true;
    s.fingerprint = blocks->fingerprint;
    s.record = std::move(*record);
    for (const auto& p : blocks->blocks) {
        if (p.disk_bytes >= 0 || p.host_bytes >= 0 || p.device_bytes >= 0) ++s.blocks_held;
        if (p.disk_bytes > 0) s.disk_bytes += static_cast<uint64_t>(p.disk_bytes);
    }
    *places = std::move(blocks->blocks);
    return s;
}

// The tiers and leases of each block, from the node's places (in the record's order).
void add_places(const std::vector<decode::StoredBlockPlace>& places, Described& d) {
    for (size_t i = 0; i < d.blocks.size() && i < places.size(); ++i) {
        BlockRow& b = d.blocks[i];
        const auto& p = places[i];
        if (p.key != b.key) continue;
        b.tiers.clear();
        if (p.device_bytes >= 0) b.tiers.push_back("device");
        if (p.host_bytes >= 0) b.tiers.push_back("host");
        if (p.disk_bytes >= 0) b.tiers.push_back("disk");
        b.leases = p.leases;
    }
}

}  // namespace

int session_main(int argc, char** argv) {
    // deltactl session describe ID [flags]
    if (argc < 1 || std::string(argv[0]) != "describe")
        return usage_error("usage: deltactl session describe ID [flags]");
    --argc, ++argv;
    const std::string id = take_id(argc, argv);
    Common c;
    ArgParser p("deltactl session describe ID",
                "Everything about one session: its records, each layer's tokens by kind, bytes "
                "and reconstruction error, and its blocks with their checks.");
    add_common(p, c);
    std::string tokens_range, model_path;
    p.add("tokens", &tokens_range,
          "B:E: also the tokens [B, E) of the session, each with its kind (sink, reference, "
          "latent, buffer) and, with --model, its text");
    p.add("model", &model_path, "the model whose tokenizer gives the tokens' text");
    if (auto code = parse_flags(p, argc, argv)) return *code;
    if (id.empty())
        return usage_error("deltactl session describe: which session? (ID or TENANT/ID)");
    int32_t tb = 0, te = 0;
    if (p.given("tokens") &&
        (std::sscanf(tokens_range.c_str(), "%d:%d", &tb, &te) != 2 || tb < 0 || te <= tb))
        return usage_error("--tokens must be B:E with 0 <= B < E, not '" + tokens_range + "'");
    init_logging("warn");
    int code = 0;
    std::unique_ptr<StoreView> view;
    std::unique_ptr<LiveAdmin> admin;
    LiveState live;
    std::vector<decode::StoredBlockPlace> places;
    Result<StoredSession> s = not_found("");
    BlockReader read;
    if (c.live()) {
        admin = connect_live(c, &code);
        if (!admin) return code;
        s = live_session(*admin, id, &live, &places);
        read = [&](uint64_t key) { return admin->read_block(live.node, key); };
    } else {
        view = open_view(c, &code);
        if (!view) return code;
        s = view->session(id);
        if (s.ok() && s->store != nullptr) read = store_reader(*view, *s->store);
    }
    if (!s.ok()) return store_error(s.status());
    Described d = s->has_kv_record ? describe_blocks(*s, read) : Described{};
    add_places(places, d);
    std::vector<TokenRow> token_rows;
    std::vector<std::string> texts;
    if (p.given("tokens")) {
        if (!s->has_kv_record) return store_error(not_found("session " + id + " has no stored KV"));
        auto rows = token_kinds(*s, read, tb, te);
        if (!rows.ok()) return store_error(rows.status());
        token_rows = std::move(*rows);
        if (!model_path.empty()) {
            model::LoadOptions lo;
            lo.show_progress = false;
            auto m = model::load_model(model_path, lo);
            if (!m.ok()) return store_error(m.status());
            if (!(*m)->tokenizer)
                return store_error(failed_precondition("the model has no tokenizer"));
            for (const TokenRow& t : token_rows)
                texts.push_back((*m)->tokenizer->token_to_piece(t.id));
        }
    }
    return print_session(c, *s, d, p.given("tokens"), tb, te, token_rows, texts,
                         c.live() ? &live : nullptr);
}

int blocks_main(int argc, char** argv) {
    Common c;
    std::string session;
    bool shared = false;
    ArgParser p("deltactl blocks",
                "Lists stored blocks: their tokens, codec, bytes, the sessions that name them, "
                "their age (offline) or tiers and leases (--server); and what prefix sharing "
                "saves.");
    add_common(p, c);
    p.add("session", &session, "only the blocks of this session (ID or TENANT/ID)");
    p.add_switch("shared", &shared, "only blocks more than one session names");
    if (auto code = parse_flags(p, argc, argv)) return *code;
    init_logging("warn");
    int code = 0;
    // Each block once: its header, bytes, the sessions naming it and, live, where it is.
    struct Row {
        std::string node;
        uint64_t key = 0;
        uint64_t bytes = 0;
        int32_t refs = 0;
        int64_t mtime = 0;
        std::optional<kvstore::KvBlockMeta> meta;
        std::string fault;
        std::vector<std::string> tiers;
        std::vector<decode::StoredBlockPlace::Holder> leases;
        bool wanted = true;  // live: named by the session asked for
    };
    std::vector<Row> rows;
    std::unique_ptr<LiveAdmin> admin;
    if (c.live()) {
        // The blocks the sessions name, node by node (a node's tiers are asked once a session).
        admin = connect_live(c, &code);
        if (!admin) return code;
        auto list = admin->sessions(api::kMaxSessionPage);
        if (!list.ok()) return store_error(list.status());
        std::map<std::pair<std::string, uint64_t>, size_t> at;
        bool found = !p.given("session");
        for (const auto& r : *list) {
            const bool wanted = !p.given("session") || r.key == session || r.info.id == session;
            found = found || wanted;
            if (r.kv.blocks <= 0) continue;
            std::string node;
            auto b = admin->session_blocks(r.info.tenant, r.info.id, &node);
            if (b.status().code() == StatusCode::kNotFound) continue;  // gone since the list
            if (!b.ok()) return store_error(b.status());
            for (const auto& place : b->blocks) {
                auto [it, fresh] = at.emplace(std::make_pair(node, place.key), rows.size());
                if (fresh) {
                    Row row;
                    row.node = node;
                    row.key = place.key;
                    if (place.device_bytes >= 0) row.tiers.push_back("device");
                    if (place.host_bytes >= 0) row.tiers.push_back("host");
                    if (place.disk_bytes >= 0) row.tiers.push_back("disk");
                    row.bytes = static_cast<uint64_t>(
                        std::max({place.disk_bytes, place.host_bytes, place.device_bytes}));
                    row.leases = place.leases;
                    row.wanted = false;
                    rows.push_back(std::move(row));
                }
                Row& row = rows[it->second];
                ++row.refs;
                row.wanted = row.wanted || wanted;
            }
        }
        if (!found) return store_error(not_found("no session " + session + " on the server"));
        std::erase_if(rows, [](const Row& r) { return !r.wanted; });
        for (Row& row : rows) {
            if (row.tiers.empty()) {
                row.fault = "not held";
                continue;
            }
            auto bytes = admin->read_block(row.node, row.key, 64 << 10);
            if (bytes.ok() && bytes->size() >= 12) {
                uint32_t header = 0;
                std::memcpy(&header, bytes->data() + 8, 4);
                if (header > bytes->size()) bytes = admin->read_block(row.node, row.key, header);
            }
            if (!bytes.ok()) {
                row.fault = bytes.status().message();
                continue;
            }
            if (auto m = parse_any_block_header(*bytes, &row.fault); m.ok())
                row.meta = std::move(*m);
        }
    } else {
        auto view = open_view(c, &code);
        if (!view) return code;
        std::map<uint64_t, int32_t> named;  // key -> sessions naming it
        std::set<uint64_t> wanted;
        for (const auto& s : view->sessions()) {
            for (uint64_t k : s.record.keys) ++named[k];
        }
        if (p.given("session")) {
            auto s = view->session(session);
            if (!s.ok()) return store_error(s.status());
            wanted.insert(s->record.keys.begin(), s->record.keys.end());
        }
        for (auto& h : view->blocks()) {
            if (p.given("session") && !wanted.count(h.entry.key)) continue;
            Row row;
            row.node = h.store->name;
            row.key = h.entry.key;
            row.bytes = h.entry.bytes;
            row.refs = named.count(h.entry.key) ? named[h.entry.key] : 0;
            row.mtime = h.entry.mtime_s;
            row.meta = std::move(h.meta);
            row.fault = std::move(h.fault);
            row.tiers = {"disk"};
            rows.push_back(std::move(row));
        }
    }
    const int64_t now = unix_now();
    uint64_t total = 0, saved = 0;
    size_t count = 0;
    json out = json::array();
    Table t(c.live() ? std::vector<std::string>{"KEY", "NODE", "TOKENS", "CODEC", "BYTES",
                                                "SESSIONS", "TIERS", "LEASES", "HEADER"}
                     : std::vector<std::string>{"KEY", "NODE", "TOKENS", "CODEC", "BYTES",
                                                "SESSIONS", "AGE", "HEADER"});
    for (const Row& r : rows) {
        if (shared && r.refs < 2) continue;
        ++count;
        total += r.bytes;
        if (r.refs > 1) saved += static_cast<uint64_t>(r.refs - 1) * r.bytes;
        const bool ok = r.meta.has_value();
        if (c.as_json) {
            out.push_back({{"key", hex64(r.key)},
                           {"node", r.node},
                           {"begin", ok ? json(r.meta->begin) : json()},
                           {"end", ok ? json(r.meta->end) : json()},
                           {"codec", ok ? json(codec_name(r.meta->codec)) : json()},
                           {"bytes", r.bytes},
                           {"sessions", r.refs},
                           {"mtime", r.mtime > 0 ? json(r.mtime) : json()},
                           {"tiers", r.tiers},
                           {"leases", c.live() ? leases_json(r.leases) : json()},
                           {"header", ok ? "ok" : r.fault}});
            continue;
        }
        std::vector<std::string> cells = {
            short_hash(r.key),
            r.node.empty() ? "-" : r.node,
            ok ? std::to_string(r.meta->begin) + "-" + std::to_string(r.meta->end) : kUnknown,
            ok ? codec_name(r.meta->codec) : kUnknown,
            human_bytes(r.bytes),
            std::to_string(r.refs)};
        if (c.live()) {
            cells.push_back(tiers_text(r.tiers));
            cells.push_back(leases_text(r.leases));
        } else {
            cells.push_back(human_age(r.mtime, now));
        }
        cells.push_back(ok ? "ok" : r.fault);
        t.add(std::move(cells));
    }
    if (c.as_json) {
        std::printf("%s\n", json_text(c, json({{"blocks", std::move(out)},
                                               {"count", count},
                                               {"bytes", total},
                                               {"bytes_saved_by_sharing", saved}}))
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

}  // namespace deltaserve::ops
