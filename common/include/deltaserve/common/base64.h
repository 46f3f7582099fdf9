// Base64 (RFC 4648, the standard alphabet, padded): how etcd's JSON gateway carries keys and
// values.
#pragma once

#include <string>
#include <string_view>

#include "deltaserve/common/status.h"

namespace deltaserve {

std::string base64_encode(std::string_view bytes);

// Strict: only the standard alphabet, a length that is a multiple of 4, padding only at the
// end and zero bits under it; anything else is an invalid_argument naming the offset.
Result<std::string> base64_decode(std::string_view text);

}  // namespace deltaserve
