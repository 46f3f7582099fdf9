#include "deltaserve/model/kv_groups.h"

#include <vector>

namespace deltaserve::model {

Result<kvstore::KvLayerGroups> kv_layer_groups(const ModelConfig& config) {
    if (config.sliding_window <= 0) return kvstore::KvLayerGroups::whole(config.n_layers);
    std::vector<bool> window_layer(static_cast<size_t>(config.n_layers));
    for (int32_t l = 0; l < config.n_layers; ++l) window_layer[l] = config.is_local(l);
    return kvstore::KvLayerGroups::make(window_layer, config.sliding_window);
}

}  // namespace deltaserve::model
