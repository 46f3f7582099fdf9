#include "deltaserve/kvstore/kv_layer_groups.h"

#include <algorithm>
#include <string>

namespace deltaserve::kvstore {

KvLayerGroups KvLayerGroups::whole(int32_t n_layers) {
    KvLayerGroups g;
    g.group_layers = n_layers;
    g.group.assign(static_cast<size_t>(n_layers), 0);
    g.index.resize(static_cast<size_t>(n_layers));
    for (int32_t l = 0; l < n_layers; ++l) g.index[l] = l;
    g.windowed = {false};
    g.real_layers = {n_layers};
    return g;
}

Result<KvLayerGroups> KvLayerGroups::make(const std::vector<bool>& window_layer, int32_t window) {
    const auto n = static_cast<int32_t>(window_layer.size());
    if (n == 0) return invalid_argument("KV layer groups: no layers");
    if (window < 0) return invalid_argument("KV layer groups: a negative window");
    const auto n_window =
        static_cast<int32_t>(std::count(window_layer.begin(), window_layer.end(), true));
    if (window == 0 || n_window == 0) return whole(n);
    const int32_t n_global = n - n_window;
    int32_t g = n_window;  // no global layer: one window group
    if (n_global > 0) {
        g = 1;
        for (int32_t d = n_global; d >= 1; --d) {
            if (n_global % d != 0) continue;
            const int32_t padded = (n_window + d - 1) / d * d - n_window;
            if (padded * 10 <= n_window) {
                g = d;
                break;
            }
        }
    }
    KvLayerGroups out;
    out.group_layers = g;
    out.window = window;
    out.group.resize(static_cast<size_t>(n));
    out.index.resize(static_cast<size_t>(n));
    // Global layers first, then window layers, each filling groups in layer order.
    int32_t next_group = 0;
    for (const bool want_window : {false, true}) {
        int32_t in_group = g;  // the current group is full: the next layer opens one
        for (int32_t l = 0; l < n; ++l) {
            if (window_layer[l] != want_window) continue;
            if (in_group == g) {
                out.windowed.push_back(want_window);
                out.real_layers.push_back(0);
                in_group = 0;
                ++next_group;
            }
            out.group[l] = next_group - 1;
            out.index[l] = in_group++;
            ++out.real_layers.back();
        }
    }
    return out;
}

}  // namespace deltaserve::kvstore
