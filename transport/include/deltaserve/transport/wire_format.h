// The wire format of KV shipments: what a prefill node sends a decode node for one layer of
// one session's token range. A fixed little-endian header, three length-prefixed ids, then
// the payload; a CRC-32C covers header and payload. Version 1.
//
//   offset  size  field
//   0       4     magic "DSKV"
//   4       2     version (1)
//   6       1     codec (KvCodec)
//   7       1     flags (0)
//   8       4     layer
//   12      4     n_layers
//   16      4     token_begin
//   20      4     token_end (exclusive)
//   24      8     payload_bytes
//   32      2+n   model id, then profile id, then session id (u16 length + bytes each)
//   ...     4     CRC-32C of everything before it and of the payload
//   ...           payload
//
// decode_shipment refuses anything malformed or meant for another model or profile with a
// clear error and never reads past the buffer.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "deltaserve/common/crc32c.h"  // the checksum (deltaserve::crc32c)
#include "deltaserve/common/status.h"

namespace deltaserve::transport {

inline constexpr uint16_t kWireVersion = 1;
inline constexpr size_t kMaxIdBytes = 1024;

enum class KvCodec : uint8_t {
    kRawF16 = 1,   // full KV rows, fp16
    kRawF32 = 2,   // full KV rows, fp32
    kDeltaKv = 3,  // DeltaKV: references, int4 latents and their indices
};

struct ShipmentHeader {
    KvCodec codec = KvCodec::kRawF16;
    int32_t layer = 0;
    int32_t n_layers = 0;
    int32_t token_begin = 0;
    int32_t token_end = 0;
    std::string model_id;
    std::string profile_id;  // "" for codecs without a profile
    std::string session_id;
};

// A decoded shipment; payload points into the buffer given to decode_shipment.
struct Shipment {
    ShipmentHeader header;
    std::span<const uint8_t> payload;
};

// Header and payload as one buffer. Errors: kInvalidArgument for an id over kMaxIdBytes or
// a header that does not describe a valid range.
Result<std::vector<uint8_t>> encode_shipment(const ShipmentHeader& header,
                                             std::span<const uint8_t> payload);

// Parses and checks a shipment. Errors: kDataLoss for a truncated buffer or a checksum
// mismatch; kInvalidArgument for a bad magic, an unknown version or codec, an invalid
// layer or token range; kFailedPrecondition when the model or profile id differs from the
// expected ones (an empty expectation accepts any).
Result<Shipment> decode_shipment(std::span<const uint8_t> bytes, std::string_view expect_model_id,
                                 std::string_view expect_profile_id);

}  // namespace deltaserve::transport
