// A session's stored record (decode/src/session_tiers.h), as a decode worker reads it back
// from the disk tier after a restart: any bytes parse or are refused, never read past; a
// record that parses has its blocks' ends in order, as many tokens as its last block's end,
// and encodes back to the same bytes.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "session_tiers.h"

using deltaserve::decode::SessionTiers;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view bytes(reinterpret_cast<const char*>(data), size);
    auto r = SessionTiers::decode_record(bytes);
    if (!r) return 0;
    if (r->keys.empty() || r->keys.size() != r->ends.size() || r->keys.size() != r->crcs.size())
        std::abort();
    for (size_t i = 1; i < r->ends.size(); ++i) {
        if (r->ends[i] <= r->ends[i - 1]) std::abort();
    }
    if (static_cast<size_t>(r->ends.back()) != r->tokens.size()) std::abort();
    if (SessionTiers::encode_record(*r) != bytes) std::abort();
    return 0;
}
