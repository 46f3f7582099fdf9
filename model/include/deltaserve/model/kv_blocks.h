// A session's committed KV as stored blocks (kvstore/kv_block.h): what the tiered store keeps
// when a session leaves decode memory, and what brings it back into a context. Blocks cut
// the tokens into runs of block_tokens (the last may be shorter), each holding every layer's
// rows of its run in the cache's own form (the codec's rows: DeltaKV's references, latents
// and reference ordinals, or fp16 rows), chained from `root`: block i's parent is block i-1's
// key. A context fed the blocks back continues exactly as the one they came from.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "deltaserve/common/status.h"
#include "deltaserve/kvstore/kv_policy.h"
#include "deltaserve/model/inference_context.h"

namespace deltaserve::model {

struct KvBlocksOptions {
    // What the KV depends on besides the tokens (model, tokenizer, profile): every block
    // carries it and a reader expecting another refuses the block.
    uint64_t fingerprint = 0;
    // The first block's parent: the fingerprint for a shareable prefix, or a root scoped to
    // the session where the policy's blocks depend on what came after them (DeltaKV).
    uint64_t root = 0;
    int32_t block_tokens = 256;
    kvstore::KvCodecId codec = kvstore::KvCodecId::kRows;
    // export_kv_blocks: the blocks before this one are not exported (a store holds them
    // already); their keys still chain the rest.
    int32_t first_block = 0;
};

struct ExportedKvBlocks {
    std::vector<std::vector<uint8_t>> blocks;  // encoded, in token order, from first_block
    std::vector<uint8_t> hints;                // the decode hints (DeltaKV's pins)
};

// The context's committed tokens as blocks; `tokens` are their ids (n_past() of them).
// Errors: kInvalidArgument for a token count that is not the context's, kUnimplemented for a
// policy whose KV cannot leave its cache.
Result<ExportedKvBlocks> export_kv_blocks(const InferenceContext& ctx,
                                          std::span<const int32_t> tokens,
                                          const KvBlocksOptions& options);

// Takes blocks back into an empty context made with the same options, after checking every
// one (kvstore::parse_kv_block: checksums, fingerprint, key) and that they chain from `root`
// over consecutive runs from token 0. On any error nothing stays imported (the context is
// empty again); `bad_block`, when given, says which block was refused (-1: none).
Status import_kv_blocks(InferenceContext& ctx, std::span<const std::span<const uint8_t>> blocks,
                        std::span<const uint8_t> hints, const KvBlocksOptions& options,
                        int32_t* bad_block = nullptr);

}  // namespace deltaserve::model
