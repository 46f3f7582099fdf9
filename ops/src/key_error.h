// The logit correction's statistics for a DeltaKV profile (kvstore::DeltaKvOptions::
// logit_correction): how far each layer's reconstructed keys are from the real ones.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <nlohmann/json.hpp>

#include "deltaserve/common/status.h"
#include "deltaserve/model/model.h"

namespace deltaserve::ops {

// Runs the model over each sequence, compresses every layer's [K; V] as the cache would
// (kvstore::deltakv_key_error_variance) and returns the profile's "key_error_var": per
// layer, the error variance per KV head and RoPE pair, averaged over the sequences by token
// count (every layer with a compressor: any of them may be compressed; an empty list for a
// sliding-window layer, which has none).
Result<nlohmann::json> measure_key_error(const model::Model& m, const std::string& profile_json,
                                         const std::vector<std::vector<int32_t>>& sequences,
                                         int threads);

}  // namespace deltaserve::ops
