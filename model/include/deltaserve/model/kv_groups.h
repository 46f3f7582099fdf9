// How a model's layers share the KV block pool's blocks (kvstore::KvLayerGroups): one group of
// every layer, or, for a model with sliding-window layers, groups of its global and of its
// window layers. What the contexts, the decode worker's pool and its prefix cache agree on.
#pragma once

#include "deltaserve/common/status.h"
#include "deltaserve/kvstore/kv_layer_groups.h"
#include "deltaserve/model/model_config.h"

namespace deltaserve::model {

Result<kvstore::KvLayerGroups> kv_layer_groups(const ModelConfig& config);

}  // namespace deltaserve::model
