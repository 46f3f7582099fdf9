// deltactl: the operators' tool (DESIGN.md "ops/").
#include <cstdio>
#include <string>

#include "commands.h"

namespace {

constexpr const char* kUsage =
    "usage: deltactl <command> [flags]\n"
    "\n"
    "commands:\n"
    "  sessions    the sessions a store holds, one row each\n"
    "  session     describe ID: everything about one session (turns, layers, blocks)\n"
    "  blocks      stored blocks, the sessions sharing them and what sharing saves\n"
    "  tiers       each tier's capacity and use, and the disk tier's index\n"
    "  verify      check every stored block, payload file and record (--drop removes what is bad)\n"
    "  repair      rebuild a damaged store's index from its blocks and records\n"
    "  explain     ID: which stored blocks its next turn takes, and why the others not\n"
    "  fidelity    ID --model M: what compression costs it (KL against full KV)\n"
    "  export      ID -o FILE: a session's records and blocks in one file\n"
    "  import      FILE: a session exported elsewhere, into a data dir\n"
    "  cluster     the gateway and its nodes: addresses, versions, load, tiers (live)\n"
    "  checkpoint  a running server's stores copied for the offline views (live)\n"
    "  evict       ID: a session's KV out of decode memory into the tiers (live)\n"
    "  drop        ID: forget a session, its history and KV (live)\n"
    "  pin, unpin  ID: keep a session's KV in decode memory, or let the LRU have it (live)\n"
    "  calibrate   train a model's DeltaKV compressors from text and write a profile\n"
    "\n"
    "The cache views read a stopped node's --data-dir (default: serve's), or a checkpoint\n"
    "of one; sessions, tiers and cluster ask a running server with --server HOST:PORT\n"
    "(or --config cluster.yaml) and its admin key.\n"
    "Exit codes: 0 ok, 1 a server or store error, 2 usage.\n"
    "\n"
    "Run 'deltactl <command> --help' for a command's flags.\n";

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fputs(kUsage, stderr);
        return 2;
    }
    const std::string cmd = argv[1];
    if (cmd == "--help" || cmd == "-h" || cmd == "help") {
        std::fputs(kUsage, stdout);
        return 0;
    }
    namespace o = deltaserve::ops;
    if (cmd == "calibrate") return o::calibrate_main(argc - 2, argv + 2);
    if (cmd == "sessions") return o::sessions_main(argc - 2, argv + 2);
    if (cmd == "session") return o::session_main(argc - 2, argv + 2);
    if (cmd == "blocks") return o::blocks_main(argc - 2, argv + 2);
    if (cmd == "tiers") return o::tiers_main(argc - 2, argv + 2);
    if (cmd == "verify") return o::verify_main(argc - 2, argv + 2);
    if (cmd == "repair") return o::repair_main(argc - 2, argv + 2);
    if (cmd == "export") return o::export_main(argc - 2, argv + 2);
    if (cmd == "import") return o::import_main(argc - 2, argv + 2);
    if (cmd == "cluster") return o::cluster_main(argc - 2, argv + 2);
    if (cmd == "checkpoint") return o::checkpoint_main(argc - 2, argv + 2);
    if (cmd == "evict") return o::evict_main(argc - 2, argv + 2);
    if (cmd == "drop") return o::drop_main(argc - 2, argv + 2);
    if (cmd == "pin") return o::pin_main(argc - 2, argv + 2);
    if (cmd == "unpin") return o::unpin_main(argc - 2, argv + 2);
    if (cmd == "explain") return o::explain_main(argc - 2, argv + 2);
    if (cmd == "fidelity") return o::fidelity_main(argc - 2, argv + 2);
    std::fprintf(stderr, "deltactl: error: unknown command '%s' (see deltactl --help)\n",
                 cmd.c_str());
    return 2;
}
