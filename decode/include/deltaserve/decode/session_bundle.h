// A session in one portable file (deltactl export / import): its KV record, the blocks it
// names and the gateway's record of it, so that it continues on another node or data dir
// with the same answers. Read back as hostile bytes: decode_session_bundle checks the whole
// file's checksum, every length, the record, and each block (its own checks with the
// bundle's fingerprint, its key, and its CRC against the record's) before anything is used.
//
// Version 1, little-endian: "DSBN", u32 version, u64 fingerprint, u32 n + the session key
// (tenant/id), u32 n + the gateway's record (JSON; may be empty), u32 n + the KV record
// (session_record.h), u32 n blocks, each u64 key, u64 n + its bytes (kvstore/kv_block.h), then
// u32 CRC-32C of everything before it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "deltaserve/common/status.h"
#include "deltaserve/decode/session_record.h"

namespace deltaserve::decode {

struct SessionBundle {
    std::string session;       // tenant/id
    uint64_t fingerprint = 0;  // the KV's (the record's key and the blocks' root)
    std::string gateway_record;
    SessionRecord record;
    std::vector<std::pair<uint64_t, std::vector<uint8_t>>> blocks;  // the record's, in order
};

std::vector<uint8_t> encode_session_bundle(const SessionBundle& b);
// Errors: kDataLoss naming what does not hold.
Result<SessionBundle> decode_session_bundle(std::span<const uint8_t> bytes);

}  // namespace deltaserve::decode
