// deltactl: the operators' tool (DESIGN.md "ops/").
#include <cstdio>
#include <string>

#include "commands.h"

namespace {

constexpr const char* kUsage =
    "usage: deltactl <command> [flags]\n"
    "\n"
    "commands:\n"
    "  calibrate   train a model's DeltaKV compressors from text and write a profile\n"
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
    if (cmd == "calibrate") return deltaserve::ops::calibrate_main(argc - 2, argv + 2);
    std::fprintf(stderr, "deltactl: error: unknown command '%s' (see deltactl --help)\n", cmd.c_str());
    return 2;
}
