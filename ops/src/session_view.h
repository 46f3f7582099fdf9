// What one stored session holds, read and checked block by block (deltactl session describe
// and explain): per layer its tokens by kind, bytes and recorded reconstruction error; per
// block its range, bytes and the check a node would make of it.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "command_support.h"
#include "deltaserve/decode/decode_worker.h"
#include "store_view.h"
#include "table.h"

namespace deltaserve::ops {

// What one session's stored blocks hold, read and checked block by block.
struct LayerSum {
    bool full = true;
    bool window = false;  // a sliding-window layer (its window kept exact)
    int64_t sinks = 0, references = 0, latents = 0, buffer = 0;
    uint64_t exact_bytes = 0, latent_bytes = 0;
    double err_sq = 0.0;
    int64_t err_latents = 0;
    double error() const {
        if (full) return NAN;
        if (latents == 0) return 0.0;
        return err_latents > 0 ? std::sqrt(err_sq / static_cast<double>(err_latents)) : NAN;
    }
};
struct BlockRow {
    uint64_t key = 0;
    int32_t begin = 0, end = 0;
    uint64_t bytes = 0;
    bool held = false;
    std::string check;   // ok, or why not
    double error = NAN;  // mean over the layers that measured
    // Live only (a running node's view): the tiers holding it and who leases it.
    std::vector<std::string> tiers;
    std::vector<decode::StoredBlockPlace::Holder> leases;
};
struct Described {
    std::vector<LayerSum> layers;
    std::vector<BlockRow> blocks;
    std::string policy = kUnknown;
    double keep = NAN;  // bytes over full KV's fp16
    int64_t tokens_readable = 0;
};

// A stored block's bytes (kNotFound when its store does not hold it): from a store, or from
// a running node's tiers (LiveAdmin::read_block).
using BlockReader = std::function<Result<std::vector<uint8_t>>(uint64_t key)>;
BlockReader store_reader(const StoreView& view, const Store& store);

Described describe_blocks(const StoredSession& s, const BlockReader& read);
// A layer's role: "sparse" (compressed), "observation" (a full layer before sparse ones,
// whose queries pick the tokens they reconstruct), "window" (a sliding-window layer, its
// window exact) or "full".
std::string layer_role(const Described& d, size_t layer);

// Tokens [begin, end) of the session: each one's id and kind (sink, reference, latent, recent
// buffer; exact under full KV), read from its blocks' first sparse layer (DeltaKV's kinds are
// the same in every sparse layer). Errors: kOutOfRange, or a block that cannot be read.
struct TokenRow {
    int32_t position = 0, id = 0;
    std::string kind;
};
Result<std::vector<TokenRow>> token_kinds(const StoredSession& s, const BlockReader& read,
                                          int32_t begin, int32_t end);
// The fields the offline views know of a session (null where only a server would).
json session_json(const StoredSession& s);

}  // namespace deltaserve::ops
