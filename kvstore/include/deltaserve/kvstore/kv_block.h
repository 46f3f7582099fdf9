// A stored KV block: one session's tokens [begin, end) for every layer, in its cache's own
// form (SequenceCodec::export_rows: DeltaKV's references, latents and reference ordinals, or
// fp16 rows for full KV), with a header that describes and verifies it, so that what leaves
// decode memory (the host and disk tiers, an export bundle) comes back only into a cache that
// can use it, and never wrong (DESIGN.md "KV representation"). Version 1, little-endian:
//
//   offset  size  field
//   0       4     magic "DSKB"
//   4       2     format version (1)
//   6       1     codec (KvCodecId)
//   7       1     flags (0)
//   8       4     header bytes (all of it, its checksum included)
//   12      4     n_layers
//   16      8     fingerprint: the root of the keys (model weights, tokenizer, profile)
//   24      8     key = hash_tokens(parent, tokens) (common/chain_hash.h)
//   32      8     parent: the key of the block before (the fingerprint for the first)
//   40      4     begin
//   44      4     end (exclusive)
//   48      8     payload bytes
//   56      4     CRC-32C of the payload
//   60      4     codec state bytes s
//   64      s     codec state (export_rows_state's settings: what an importer must share)
//   ...     4 n   the tokens' ids, n = end - begin
//   ...     8 L   each layer's part bytes, L = n_layers
//   ...     4 L   each layer's reconstruction error when it was compressed (f32, the
//                 codec's rows_error; NaN where not measured: full layers, full KV)
//   ...     4     CRC-32C of the header before it
//   ...           payload: the layers' parts in order
//
// parse_kv_block checks everything before it returns: sizes and limits, both checksums, the
// fingerprint, and that the key is the hash of the parent and the tokens.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "deltaserve/common/status.h"
#include "deltaserve/kvstore/kv_policy.h"

namespace deltaserve::kvstore {

constexpr uint16_t kKvBlockVersion = 1;
// Limits a parsed block must keep (a header is read before anything is allocated for it).
constexpr uint32_t kKvBlockMaxLayers = 4096;
constexpr int32_t kKvBlockMaxTokens = 1 << 20;
constexpr uint32_t kKvBlockMaxCodecState = 1 << 20;

struct KvBlockMeta {
    KvCodecId codec = KvCodecId::kNone;
    uint64_t fingerprint = 0, key = 0, parent = 0;
    int32_t begin = 0, end = 0;
    std::vector<uint8_t> codec_state;
    std::vector<int32_t> tokens;       // end - begin ids
    std::vector<float> layer_error;    // n_layers values
    std::vector<uint64_t> part_bytes;  // n_layers values (set by encode_kv_block)
    uint64_t payload_bytes = 0;        // (set by encode_kv_block)
    uint32_t payload_crc = 0;          // (set by encode_kv_block)
    uint32_t header_bytes = 0;         // (set by encode_kv_block and parse)

    int32_t n_layers() const { return static_cast<int32_t>(layer_error.size()); }
};

// A parsed block: its header and views of its layers' parts in the parsed bytes.
struct KvBlockView {
    KvBlockMeta meta;
    std::vector<std::span<const uint8_t>> parts;
};

// Why a block was refused: what a store counts.
enum class KvBlockFault : uint8_t {
    kNone,
    kFormat,       // not a block, cut short, sizes or limits broken (kDataLoss)
    kVersion,      // a format version this build does not read (kFailedPrecondition)
    kChecksum,     // header or payload CRC mismatch (kDataLoss)
    kFingerprint,  // made for another model, tokenizer or profile (kFailedPrecondition)
    kKey,          // the key is not the hash of its parent and tokens (kDataLoss)
};
std::string_view kv_block_fault_name(KvBlockFault fault);

// The block's bytes: meta's fields (codec, fingerprint, parent, tokens, begin, end,
// codec_state, layer_error) and one part per layer; the key is computed from the parent and
// the tokens. Errors: kInvalidArgument for a meta that breaks the limits or parts that do not
// match its layers.
Result<std::vector<uint8_t>> encode_kv_block(const KvBlockMeta& meta,
                                             std::span<const std::span<const uint8_t>> parts);

// The header only (the first meta.header_bytes bytes of a block; `bytes` may hold more):
// checked as parse_kv_block checks it, the payload's CRC aside. For indexes and tools that
// read what a block holds without its payload.
Result<KvBlockMeta> parse_kv_block_header(std::span<const uint8_t> bytes, uint64_t fingerprint,
                                          KvBlockFault* fault = nullptr);

// A whole block, nothing after it. `fault` (optional) says why it was refused.
Result<KvBlockView> parse_kv_block(std::span<const uint8_t> bytes, uint64_t fingerprint,
                                   KvBlockFault* fault = nullptr);

}  // namespace deltaserve::kvstore
