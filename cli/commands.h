// The subcommands of the deltaserve binary; each returns the process exit code.
#pragma once

namespace deltaserve::cli {

int generate_main(int argc, char** argv);
int chat_main(int argc, char** argv);
int score_main(int argc, char** argv);
int serve_main(int argc, char** argv);
int gateway_main(int argc, char** argv);
int prefill_main(int argc, char** argv);
int decode_main(int argc, char** argv);

}  // namespace deltaserve::cli
