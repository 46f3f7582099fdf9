// The subcommands of deltactl; each returns the process exit code.
#pragma once

namespace deltaserve::ops {

int calibrate_main(int argc, char** argv);
// The stored cache, offline (store_commands.cpp).
int sessions_main(int argc, char** argv);
int session_main(int argc, char** argv);
int blocks_main(int argc, char** argv);
int tiers_main(int argc, char** argv);
int verify_main(int argc, char** argv);
// A damaged store's index rebuilt (repair_command.cpp).
int repair_main(int argc, char** argv);
int cluster_main(int argc, char** argv);
int checkpoint_main(int argc, char** argv);
int drop_main(int argc, char** argv);
int evict_main(int argc, char** argv);
int pin_main(int argc, char** argv);
int unpin_main(int argc, char** argv);
int explain_main(int argc, char** argv);
int fidelity_main(int argc, char** argv);
// A session moved between data dirs (bundle_commands.cpp).
int export_main(int argc, char** argv);
int import_main(int argc, char** argv);

}  // namespace deltaserve::ops
