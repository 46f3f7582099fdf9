// What a stored block's layer holds, read from the codec's rows (SequenceCodec::export_rows)
// without a cache: which tokens are kept how and the bytes each kind takes. For the tools
// (deltactl session describe), on blocks read back as hostile bytes: every count is checked
// against the part's size.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "deltaserve/common/status.h"
#include "deltaserve/kvstore/kv_policy.h"

namespace deltaserve::kvstore {

struct KvRowsInfo {
    bool full = true;  // every token exact (a full layer, or full KV)
    // Tokens of the range by kind. Exact: sinks, references (DeltaKV's every stride-th token
    // and those kept exact), the recent buffer not compressed yet; compressed: latents.
    int32_t sinks = 0, references = 0, latents = 0, buffer = 0;
    // Tokens of the range a sliding-window layer no longer held when the block was written
    // (before its window): no rows.
    int32_t dropped = 0;
    bool window = false;        // a sliding-window layer's part (full KV's or DeltaKV's)
    uint64_t exact_bytes = 0;   // fp16 (or fp32) K and V rows, with the part's own header
    uint64_t latent_bytes = 0;  // latents, their reference ordinals and error codes
    // Each token's kind, in order (filled when asked for).
    enum class Kind : uint8_t { kExact, kSink, kReference, kLatent, kBuffer, kDropped };
    std::vector<Kind> kinds;
};

// One layer's part of rows [begin, end), given the rows state the block carries (its
// codec_state). Errors: kDataLoss when the state or the part does not parse or their counts
// disagree with the part's size; kInvalidArgument for a codec that ships no rows or a layer
// the state does not have.
// with_kinds: also each token's kind (kExact for every token of a full layer).
Result<KvRowsInfo> kv_rows_info(KvCodecId codec, std::span<const uint8_t> rows_state, int32_t layer,
                                int32_t begin, int32_t end, std::span<const uint8_t> part,
                                bool with_kinds = false);

}  // namespace deltaserve::kvstore
