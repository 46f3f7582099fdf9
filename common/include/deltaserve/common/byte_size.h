// Sizes as people write them on a command line or in a config file: "4GiB", "512M", "1.5G",
// "65536" (bytes). Units are binary (K = KiB = 1024 bytes); "B" and "iB" are optional.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "deltaserve/common/status.h"

namespace deltaserve {

// Errors: kInvalidArgument for anything else, or a size of 2^50 bytes or more.
Result<uint64_t> parse_byte_size(std::string_view text);

// "1.5 GiB", "512 MiB", "100 B": the largest unit that leaves at least 1.
std::string format_byte_size(uint64_t bytes);

}  // namespace deltaserve
