// The subcommands of deltactl; each returns the process exit code.
#pragma once

namespace deltaserve::ops {

int calibrate_main(int argc, char** argv);

}  // namespace deltaserve::ops
