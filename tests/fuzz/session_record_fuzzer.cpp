// A session's stored record (decode/session_record.h), as a decode worker reads it back from
// the disk tier after a restart and deltactl reads it from a stopped node's store: any bytes
// parse or are refused, never read past; a record that parses has its blocks' ends and its
// turns' ends in order within its tokens, as many tokens as its last block's end, and a
// version 2 record encodes back to the same bytes (a version 1 record, to one that parses the
// same).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "deltaserve/decode/session_record.h"

namespace d = deltaserve::decode;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view bytes(reinterpret_cast<const char*>(data), size);
    auto r = d::decode_session_record(bytes);
    if (!r) return 0;
    if (r->keys.empty() || r->keys.size() != r->ends.size() || r->keys.size() != r->crcs.size())
        std::abort();
    for (size_t i = 1; i < r->ends.size(); ++i) {
        if (r->ends[i] <= r->ends[i - 1]) std::abort();
    }
    if (static_cast<size_t>(r->ends.back()) != r->tokens.size()) std::abort();
    for (size_t i = 0; i < r->turn_ends.size(); ++i) {
        if (r->turn_ends[i] <= (i == 0 ? 0 : r->turn_ends[i - 1]) ||
            r->turn_ends[i] > r->ends.back())
            std::abort();
    }
    const std::string again = d::encode_session_record(*r);
    uint32_t version = 0;
    std::memcpy(&version, data + 4, 4);
    if (version == 2 && again != bytes) std::abort();
    auto twice = d::decode_session_record(again);
    if (!twice || twice->keys != r->keys || twice->tokens != r->tokens ||
        twice->hints != r->hints || twice->turn_ends != r->turn_ends)
        std::abort();
    return 0;
}
