// Loading TRIM-KV retention gates (written by `deltactl calibrate`): trimkv.json beside
// trimkv.safetensors (layers.{i}.gate.w1 [hidden, d_model], .b1 [hidden], .w2 [kv_heads,
// hidden], .b2 [kv_heads], F32).
#pragma once

#include <memory>
#include <string>

#include "deltaserve/common/status.h"
#include "deltaserve/kvstore/eviction_policy.h"
#include "deltaserve/model/model_config.h"

namespace deltaserve::model {

// Errors: kNotFound (missing files), kInvalidArgument (malformed json, gates for another
// model, missing or misshapen tensors), and the safetensors reader's errors.
Result<std::shared_ptr<const kvstore::RetentionGates>> load_trimkv_gates(const std::string& json_path,
                                                                        const ModelConfig& config);

}  // namespace deltaserve::model
