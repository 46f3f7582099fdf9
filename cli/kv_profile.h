// The compression profile a KV policy needs (deltakv.json, trimkv.json), found before the
// model loads: given by --kv-profile, or in profiles/<model file name>/, or made now by
// `deltactl calibrate` when --kv-calibrate says so. A policy that needs one and has none is
// refused with the commands that make it, so the first run of a fresh machine serves the
// default policy at once and calibrates only when a policy first needs it.
#pragma once

#include <string>

#include "deltaserve/common/status.h"

namespace deltaserve::cli {

struct RunOptions;

// profiles/<model file name>/<policy's profile file>; empty for a policy without one.
std::string default_kv_profile(const std::string& model_path, const std::string& policy);

// OK when o's policy needs no profile, or has one (given, or at default_kv_profile); with
// o.kv_calibrate, runs `deltactl calibrate` (its progress on stderr) to make the missing
// deltakv profile first. kFailedPrecondition naming the commands otherwise.
Status ensure_kv_profile(const RunOptions& o);

}  // namespace deltaserve::cli
