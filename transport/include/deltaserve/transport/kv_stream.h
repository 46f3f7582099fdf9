// The data plane between prefill and decode nodes: a session's KV travels on a Connection
// as a stream of messages tagged with the turn it belongs to. Each message's header is a
// StreamHeader; payloads are the cache's own bytes (kvstore export_state / wire-format
// shipments). Several streams may interleave on one connection.
//
//   kBegin   a session's KV follows: n_tokens committed tokens; payload: the cache state
//   kPart    one layer (or a range of its rows): payload is a wire-format shipment
//   kEnd     the stream is complete; token: the first generated token (-1 for history)
//   kAbort   the sender gave up on the turn; message says why
//   kPull    asks the peer for a session's cached KV (its first n_tokens), sent back as a
//            stream with the same turn id (kAbort when the peer no longer holds it)
//   kChallenge  the first message of the side connected to: message is a fresh nonce
//   kProof   the connecting side's answer, before anything else: message is
//            peer_auth.h's prove(cluster secret, "kv", nonce); a wrong one closes the
//            connection
//
// Header layout, little-endian: magic "DSST", version u8 (2), kind u8, turn u64, n_tokens
// i32, token i32, then the session id and the message (u16 length + bytes each).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "deltaserve/common/status.h"

namespace deltaserve::transport {

enum class StreamKind : uint8_t {
    kBegin = 1,
    kPart = 2,
    kEnd = 3,
    kAbort = 4,
    kPull = 5,
    kChallenge = 6,
    kProof = 7,
};

struct StreamHeader {
    StreamKind kind = StreamKind::kBegin;
    uint64_t turn = 0;
    int32_t n_tokens = 0;
    int32_t token = -1;
    std::string session;
    std::string message;
};

// Errors: kInvalidArgument for a session id or message over 1024 bytes.
Result<std::vector<std::byte>> encode_stream_header(const StreamHeader& header);
// Errors: kDataLoss for a truncated header, kInvalidArgument for a bad magic, version or kind.
Result<StreamHeader> decode_stream_header(std::span<const std::byte> bytes);

}  // namespace deltaserve::transport
