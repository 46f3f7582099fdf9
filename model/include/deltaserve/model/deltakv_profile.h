// Loading a DeltaKV compression profile (written by `deltactl calibrate`): deltakv.json
// (settings, model id, per-layer errors, sensitivity) beside deltakv.safetensors (weights).
#pragma once

#include <memory>
#include <string>

#include "deltaserve/common/status.h"
#include "deltaserve/kvstore/deltakv_cache.h"
#include "deltaserve/model/model_config.h"

namespace deltaserve::model {

// The model id a profile records for a model.
std::string deltakv_model_id(const ModelConfig& config);

// The largest latent size m a profile for this model may have: D (= 2 x the KV width), and
// no more than the engine's kernels take.
int32_t max_deltakv_latent(const ModelConfig& config);

// Errors: kNotFound (missing files), kInvalidArgument (malformed json, a profile for another
// model, settings out of range, missing or misshapen tensors), and the safetensors reader's
// errors.
Result<std::unique_ptr<kvstore::DeltaKvProfile>> load_deltakv_profile(const std::string& json_path,
                                                                      const ModelConfig& config);

// The cache settings a model and its profile fix (shape, RoPE, sinks, stride, k, window,
// latent bits); the caller adds the context size, selection and keep ratio.
kvstore::DeltaKvOptions deltakv_options(const ModelConfig& config, const kvstore::DeltaKvProfile& profile);

}  // namespace deltaserve::model
