// deltaserve: one binary, one subcommand per job.
#include <cstdio>
#include <cstring>
#include <string>

#include "commands.h"

namespace {

constexpr const char* kUsage =
    "usage: deltaserve <command> [flags]\n"
    "\n"
    "commands:\n"
    "  generate   generate a continuation of a prompt and print it\n"
    "  chat       interactive chat with a model\n"
    "  score      perplexity and KL to full KV of a text under a KV policy (JSON)\n"
    "  serve      OpenAI-compatible HTTP server (chat completions) on 127.0.0.1:8000\n"
    "  gateway    the cluster's HTTP gateway (--config cluster.yaml)\n"
    "  prefill    a prefill node of the cluster (--config cluster.yaml --name NAME)\n"
    "  decode     a decode node of the cluster (--config cluster.yaml --name NAME)\n"
    "\n"
    "Run 'deltaserve <command> --help' for a command's flags.\n";

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
    if (cmd == "generate") return deltaserve::cli::generate_main(argc - 2, argv + 2);
    if (cmd == "chat") return deltaserve::cli::chat_main(argc - 2, argv + 2);
    if (cmd == "score") return deltaserve::cli::score_main(argc - 2, argv + 2);
    if (cmd == "serve") return deltaserve::cli::serve_main(argc - 2, argv + 2);
    if (cmd == "gateway") return deltaserve::cli::gateway_main(argc - 2, argv + 2);
    if (cmd == "prefill") return deltaserve::cli::prefill_main(argc - 2, argv + 2);
    if (cmd == "decode") return deltaserve::cli::decode_main(argc - 2, argv + 2);
    std::fprintf(stderr, "deltaserve: error: unknown command '%s' (see deltaserve --help)\n",
                 cmd.c_str());
    return 2;
}
