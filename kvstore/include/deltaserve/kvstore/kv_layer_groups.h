// How a model's layers share the blocks of a BlockPool when some of them attend a sliding
// window (Gemma 3's local layers), as vLLM's hybrid allocator does: the layers go in groups of
// equal size, a block holds one group's K and V rows of kBlockTokens tokens (the pool's
// n_layers is the group size, so every block is the same size and one budget serves all),
// and a sequence keeps one block table per group. The global layers' groups hold every
// position; a window group only the blocks its window still reaches and 64 positions before
// (so a turn may rewind that far), so a window layer's memory is its window (and the chunk
// being computed), not the context.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "deltaserve/common/status.h"

namespace deltaserve::kvstore {

// Every cache's window layers keep this many positions before the window, so that a turn may
// rewind a few tokens (a chat template that renders the last answer again otherwise) without
// recomputing.
inline constexpr int32_t kWindowSlack = 64;

struct KvLayerGroups {
    int32_t group_layers = 0;          // layers per block: the pool's BlockPoolOptions::n_layers
    int32_t window = 0;                // the window layers' window in tokens; 0: none
    std::vector<int32_t> group;        // per model layer: its group
    std::vector<int32_t> index;        // per model layer: its layer in the group's blocks
    std::vector<bool> windowed;        // per group: a window group
    std::vector<int32_t> real_layers;  // per group: its layers (the last window group's may
                                       // be fewer than group_layers: padding)

    int32_t n_layers() const { return static_cast<int32_t>(group.size()); }
    int32_t n_groups() const { return static_cast<int32_t>(windowed.size()); }
    bool has_window() const { return window > 0; }
    bool is_window_layer(int32_t layer) const { return windowed[group[layer]]; }

    // One group of every layer: a model without window layers (the pool's layout before
    // windows: a block is every layer's rows).
    static KvLayerGroups whole(int32_t n_layers);
    // window_layer[l]: layer l attends its last `window` tokens only. The global layers make
    // groups of g layers, g the largest divisor of their count that pads the window layers'
    // last group by at most a tenth of them (else 1); with no global layer, one group of
    // every window layer. Without window layers (or window 0): whole().
    // Errors: kInvalidArgument for no layers or a negative window.
    static Result<KvLayerGroups> make(const std::vector<bool>& window_layer, int32_t window);
};

}  // namespace deltaserve::kvstore
