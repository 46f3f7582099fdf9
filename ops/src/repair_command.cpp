// deltactl repair: a stopped node's stores given a new index (kvstore::DiskTier::repair)
// from their self-describing blocks and the records their old index still yields.
#include <cstdio>

#include "command_support.h"
#include "commands.h"
#include "deltaserve/common/logging.h"
#include "table.h"

namespace deltaserve::ops {

namespace {

// A block file passes when it parses whole (every check of kv_block.h but the fingerprint,
// as any store is read) and names the key it is stored under.
std::string check_block(uint64_t key, std::span<const uint8_t> bytes) {
    std::string fault;
    auto v = parse_any_block(bytes, &fault);
    if (!v.ok()) return "not a valid block (" + fault + ")";
    if (v->meta.key != key) return "a block of another key";
    return {};
}

// The gateway's session records ("gw/") carried over from an index that cannot be trusted
// are marked: the session then answers its next turn with 409 session_history_lost until
// its client confirms the turn it knows (api/README.md). Other records go over as they are.
std::string mark_record(const std::string& key, const std::string& value, bool trusted) {
    if (trusted || key.rfind("gw/", 0) != 0) return value;
    json j = json::parse(value, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return value;  // kept for the gateway to judge (it drops what fails)
    j["history_lost"] = true;
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

int repair_main(int argc, char** argv) {
    Common c;
    ArgParser p("deltactl repair",
                "Rebuilds the index of each store in a stopped node's data dir from its blocks "
                "(each one checked) and the records its old index still yields. The old index "
                "is kept beside it (index.before-repair-TIME) and blocks that fail their checks "
                "are moved to quarantine/: nothing is deleted. When the old index could not be "
                "trusted (damaged, cut short, or missing), every session record carried over is "
                "marked: its next turn answers 409 session_history_lost until the client sends "
                "the turn it knows (expected_turn). Exit code 1 when a store could not be "
                "repaired.");
    add_common(p, c);
    if (auto code = parse_flags(p, argc, argv)) return *code;
    if (int code = offline_only(c, "deltactl repair")) return code;
    init_logging("warn");
    auto stores = find_stores(c.data_dir);
    if (!stores.ok()) return store_error(stores.status());
    json out = json::array();
    int code = 0;
    for (const auto& [name, dir] : *stores) {
        auto r = kvstore::DiskTier::repair(dir, check_block, mark_record);
        if (!r.ok()) {
            std::fprintf(stderr, "deltactl: error: %s: %s\n", dir.c_str(),
                         r.status().message().c_str());
            code = 1;
            continue;
        }
        const uint64_t marked = r->index_trusted ? 0 : r->records_changed;
        if (c.as_json) {
            out.push_back({{"node", name},
                           {"store", dir},
                           {"index_trusted", r->index_trusted},
                           {"index_problem", r->index_problem},
                           {"old_index", r->old_index},
                           {"blocks", r->blocks},
                           {"block_bytes", r->block_bytes},
                           {"quarantined", r->quarantined},
                           {"records", r->records},
                           {"sessions_marked", marked},
                           {"notes", r->notes}});
            continue;
        }
        std::printf("%s%s%s:\n", dir.c_str(), name.empty() ? "" : " (node ",
                    name.empty() ? "" : (name + ")").c_str());
        std::printf(
            "  old index: %s%s\n",
            r->index_trusted ? "opened clean" : ("not trusted: " + r->index_problem).c_str(),
            r->old_index.empty() ? "" : ("; kept in " + r->old_index).c_str());
        std::printf("  %llu blocks (%s) indexed again, %llu moved to quarantine\n",
                    static_cast<unsigned long long>(r->blocks), human_bytes(r->block_bytes).c_str(),
                    static_cast<unsigned long long>(r->quarantined));
        std::printf("  %llu records carried over", static_cast<unsigned long long>(r->records));
        if (marked > 0)
            std::printf(", %llu marked: their sessions may have lost turns",
                        static_cast<unsigned long long>(marked));
        std::printf("\n");
        for (const auto& note : r->notes) std::printf("  - %s\n", note.c_str());
    }
    if (c.as_json) std::printf("%s\n", out.dump(2).c_str());
    return code;
}

}  // namespace deltaserve::ops
