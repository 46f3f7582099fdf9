// A decode node's record of a session's stored KV (SessionTiers, src/session_tiers.h): which
// blocks hold which tokens, with what checksums, the decode hints, and where each turn ended.
// Kept in the disk tier's records under session_record_key, and read by deltactl. On disk it
// is read back as hostile bytes: decode_session_record checks every count and order before
// use (tests/fuzz/session_record_fuzzer.cpp).
//
// Version 2, little-endian: "DSSR", u32 version, u32 n blocks, then each block's u64 key,
// i32 end and u32 CRC-32C (0: any valid block), u32 n tokens and the ids, u32 n hint bytes
// and the hints, u32 n turns and each turn's i32 end. Version 1 (no turns) is read too.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace deltaserve::decode {

struct SessionRecord {
    std::vector<uint64_t> keys;
    std::vector<int32_t> ends;       // each block's end
    std::vector<uint32_t> crcs;      // each block's CRC-32C; 0: any valid block
    std::vector<int32_t> tokens;     // the tokens the blocks hold
    std::vector<uint8_t> hints;      // the decode hints, with every block only
    std::vector<int32_t> turn_ends;  // where each turn the tokens hold ended, ascending
    int64_t last_used = 0;           // steady ms (not stored)
};

std::string encode_session_record(const SessionRecord& r);
std::optional<SessionRecord> decode_session_record(std::string_view bytes);

// The keys of the blocks a prompt's shared prefix would be stored under (full KV's blocks,
// which depend on their tokens alone: SessionTiers), for a store's KV identity `fingerprint`
// and a cache scope (the tenant): one per whole block of `block_tokens` before the prompt's
// last token (a turn evaluates one token at least).
uint64_t prefix_root(uint64_t fingerprint, const std::string& scope);
std::vector<uint64_t> prefix_chain(uint64_t fingerprint, const std::string& scope,
                                   std::span<const int32_t> tokens, int32_t block_tokens);

// "ds/<fingerprint, 16 hex digits>/<session>": one record per session and KV identity.
std::string session_record_key(uint64_t fingerprint, const std::string& session);
bool parse_session_record_key(std::string_view key, uint64_t* fingerprint, std::string* session);

}  // namespace deltaserve::decode
