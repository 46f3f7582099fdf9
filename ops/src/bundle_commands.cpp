// deltactl export / import: a session moved between data dirs (and so between nodes) as one
// file (decode/session_bundle.h). Both work on stopped nodes' stores (store_view.h); a
// running server's is refused. Exit codes as the other commands'.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "deltaserve/common/args.h"
#include "deltaserve/common/logging.h"
#include "deltaserve/common/user_dirs.h"
#include "deltaserve/decode/session_bundle.h"
#include "store_view.h"
#include "table.h"

namespace deltaserve::ops {

namespace fs = std::filesystem;

namespace {

int usage(const std::string& what) {
    std::fprintf(stderr, "deltactl: error: %s\n", what.c_str());
    return 2;
}

int fail(const std::string& what) {
    std::fprintf(stderr, "deltactl: error: %s\n", what.c_str());
    return 1;
}

// The first positional argument (before the flags), or "".
std::string positional(int& argc, char**& argv) {
    if (argc < 1 || argv[0][0] == '-') return "";
    std::string v = argv[0];
    --argc, ++argv;
    return v;
}

}  // namespace

int export_main(int argc, char** argv) {
    const std::string id = positional(argc, argv);
    std::string data_dir = default_data_dir(), out;
    ArgParser p("deltactl export ID",
                "Writes a session (its records and every block they name, checked) to one file "
                "that deltactl import takes into another data dir.");
    p.add("data-dir", &data_dir, "a stopped node's data dir, or a checkpoint of one");
    p.add("out", &out, "the bundle file to write (-o FILE)");
    std::vector<std::string> args(argv, argv + argc);
    for (auto& a : args) {
        if (a == "-o") a = "--out";
    }
    std::vector<char*> ptrs;
    for (auto& a : args) ptrs.push_back(a.data());
    if (auto code = parse_flags(p, static_cast<int>(ptrs.size()), ptrs.data())) return *code;
    init_logging("warn");
    if (id.empty()) return usage("deltactl export: which session? (ID or TENANT/ID)");
    if (out.empty()) return usage("deltactl export: -o FILE is required");
    auto view = StoreView::open(data_dir);
    if (!view.ok()) return fail(view.status().message());
    auto s = (*view)->session(id);
    if (!s.ok()) return fail(s.status().message());
    if (!s->has_kv_record) return fail("session " + id + " has no stored KV to export");
    decode::SessionBundle b;
    b.session = s->key;
    b.fingerprint = s->fingerprint;
    b.record = s->record;
    for (const auto& store : (*view)->stores()) {
        auto g = store->tier->get_record("gw/" + s->key);
        if (g.ok() && g->has_value()) b.gateway_record = **g;
    }
    uint64_t total = 0;
    for (size_t i = 0; i < s->record.keys.size(); ++i) {
        auto bytes = (*view)->read_block(*s->store, s->record.keys[i]);
        if (!bytes.ok()) {
            return fail("session " + id + ": block " + std::to_string(i) + " (" +
                        short_hash(s->record.keys[i]) + ") cannot be read: " +
                        bytes.status().message() + "; its KV is not whole (deltactl verify)");
        }
        total += bytes->size();
        b.blocks.emplace_back(s->record.keys[i], std::move(*bytes));
    }
    const std::vector<uint8_t> file = decode::encode_session_bundle(b);
    // Checked as an importer will check it: a damaged block is never exported.
    if (auto again = decode::decode_session_bundle(file); !again.ok())
        return fail("session " + id + ": " + again.status().message());
    const std::string part = out + ".part";
    {
        std::ofstream f(part, std::ios::binary | std::ios::trunc);
        f.write(reinterpret_cast<const char*>(file.data()),
                static_cast<std::streamsize>(file.size()));
        if (!f) return fail("writing " + part + " failed");
    }
    std::error_code ec;
    fs::rename(part, out, ec);
    if (ec) return fail("renaming " + part + ": " + ec.message());
    std::printf(
        "exported session %s: %zu blocks (%s), %zu tokens, %zu turns, fingerprint %s -> %s\n",
        s->name().c_str(), b.blocks.size(), human_bytes(total).c_str(), b.record.tokens.size(),
        b.record.turn_ends.size(), short_hash(b.fingerprint).c_str(), out.c_str());
    return 0;
}

int import_main(int argc, char** argv) {
    const std::string file = positional(argc, argv);
    std::string data_dir = default_data_dir(), node;
    ArgParser p("deltactl import FILE",
                "Takes a session exported with deltactl export into a stopped node's data dir "
                "(created if need be); a server started on it with the same model, profile and "
                "KV policy continues the session with the same answers.");
    p.add("data-dir", &data_dir, "the data dir to import into");
    p.add("node", &node,
          "a cluster's data dir: the decode node whose store takes the KV (the gateway's "
          "record goes to gateway/ and names it)");
    if (auto code = parse_flags(p, argc, argv)) return *code;
    init_logging("warn");
    if (file.empty()) return usage("deltactl import: which bundle file?");
    if (data_dir.empty())
        return usage("--data-dir: no data dir (neither XDG_DATA_HOME nor HOME is set)");
    std::ifstream f(file, std::ios::binary);
    if (!f) return fail("cannot read " + file);
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)),
                                     std::istreambuf_iterator<char>());
    auto b = decode::decode_session_bundle(bytes);
    if (!b.ok()) return fail(file + ": " + b.status().message());
    // The gateway's record must name this session (a server drops one that names another);
    // into a cluster it names the node that takes the KV. Checked before anything is written.
    std::string gateway_record = b->gateway_record;
    if (!gateway_record.empty()) {
        try {
            auto j = nlohmann::json::parse(gateway_record);
            const std::string key =
                j.at("tenant").get<std::string>() + "/" + j.at("id").get<std::string>();
            if (key != b->session)
                return fail(file + ": the gateway's record names another session (" + key + ")");
            if (!node.empty()) {
                j["node"] = node;
                gateway_record = j.dump();
            }
        } catch (const std::exception& e) {
            return fail(file + ": the gateway's record does not parse: " + e.what());
        }
    }
    // Where: DIR/kv (serve), or DIR/<node>/kv and DIR/gateway/kv (a cluster).
    const fs::path root(data_dir);
    const std::string kv_dir = (node.empty() ? root / "kv" : root / node / "kv").string();
    const std::string gw_dir = (node.empty() ? root / "kv" : root / "gateway" / "kv").string();
    for (const std::string& dir : {kv_dir, gw_dir}) {
        if (const int64_t pid = kvstore::DiskTier::holder(dir))
            return fail("the store in " + dir + " is open in a running server (pid " +
                        std::to_string(pid) + "): stop it first");
    }
    kvstore::DiskTier::Options o;
    o.dir = kv_dir;
    o.capacity_bytes = UINT64_MAX;  // the server's own cap applies when it opens the store
    auto kv = kvstore::DiskTier::open(o);
    if (!kv.ok()) return fail(kv.status().message());
    const std::string ds_key = decode::session_record_key(b->fingerprint, b->session);
    const std::string gw_key = "gw/" + b->session;
    auto existing = (*kv)->get_record(ds_key);
    if (existing.ok() && existing->has_value())
        return fail("session " + b->session + " is stored in " + kv_dir + " already");
    std::unique_ptr<kvstore::DiskTier> gw_store;
    kvstore::DiskTier* gw = kv->get();
    if (gw_dir != kv_dir) {
        o.dir = gw_dir;
        auto g = kvstore::DiskTier::open(o);
        if (!g.ok()) return fail(g.status().message());
        gw_store = std::move(*g);
        gw = gw_store.get();
    }
    auto gw_existing = gw->get_record(gw_key);
    if (gw_existing.ok() && gw_existing->has_value())
        return fail("session " + b->session + " is recorded in " + gw_dir + " already");
    // The blocks, then the records with the last one (one commit): a crash leaves no record
    // naming a block that is not there.
    uint64_t total = 0;
    for (size_t i = 0; i < b->blocks.size(); ++i) {
        const bool last = i + 1 == b->blocks.size();
        std::vector<kvstore::DiskTier::Record> records;
        if (last) {
            records.emplace_back(ds_key, decode::encode_session_record(b->record));
            if (gw == kv->get() && !gateway_record.empty())
                records.emplace_back(gw_key, gateway_record);
        }
        const Status st = (*kv)->put(b->blocks[i].first, b->blocks[i].second, records);
        if (!st.ok()) return fail("storing block " + std::to_string(i) + ": " + st.message());
        total += b->blocks[i].second.size();
    }
    if (gw != kv->get() && !gateway_record.empty()) {
        const kvstore::DiskTier::Record r[] = {{gw_key, gateway_record}};
        const Status st = gw->put_records(r);
        if (!st.ok()) return fail("storing the gateway's record: " + st.message());
    }
    // Named as the other commands name it: the id alone without a tenant.
    const std::string name = b->session.rfind('/', 0) == 0 ? b->session.substr(1) : b->session;
    std::printf("imported session %s: %zu blocks (%s), %zu tokens, fingerprint %s -> %s%s\n",
                name.c_str(), b->blocks.size(), human_bytes(total).c_str(), b->record.tokens.size(),
                short_hash(b->fingerprint).c_str(), kv_dir.c_str(),
                b->gateway_record.empty() ? " (no gateway record: the session is not listed)" : "");
    return 0;
}

}  // namespace deltaserve::ops
