// deltaserve serve's data dir (--data-dir): where the tiered store's disk tier and the
// gateway's session records live across restarts, and the identity that stored KV is tied to.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "deltaserve/common/status.h"
#include "deltaserve/common/user_dirs.h"
#include "deltaserve/kvstore/disk_tier.h"
#include "deltaserve/model/inference_context.h"

namespace deltaserve::cli {

// An eighth of physical memory: the host tier's default size.
uint64_t default_host_tier_bytes();

// Opens (creating) DIR/kv, the disk tier, capped at `capacity` bytes (0: half of the free
// space of DIR's file system, at most 64 GiB), keeping `reserve` bytes of the disk free
// (DiskTier::Options::reserve_bytes). Errors name the directory, and the process holding it
// when another does; a damaged store (kDataLoss) names the repair command.
Result<std::shared_ptr<kvstore::DiskTier>> open_data_dir(
    const std::string& dir, uint64_t capacity,
    uint64_t reserve = kvstore::DiskTier::Options().reserve_bytes);

// What stored KV depends on besides the tokens and the policy: a hash of the model's files,
// the tokenizer file given and the KV profile's contents, as 16 hex digits. Reads the files
// once (CRC-32C, at the disk's speed).
Result<std::string> store_identity(const std::string& model_path, const std::string& tokenizer_path,
                                   const model::ContextOptions& context);

}  // namespace deltaserve::cli
