// CRC-32C (Castagnoli, polynomial 0x1EDC6F41 reflected), the checksum of iSCSI, ext4 and
// RocksDB: what guards the KV wire format and stored KV blocks. With SSE 4.2 it runs on the
// crc32 instruction, 8 bytes at a time in three interleaved streams; elsewhere from a table.
#pragma once

#include <cstdint>
#include <span>

namespace deltaserve {

// Extends `crc` (the CRC of earlier bytes, 0 for none) by `data`: crc32c(a + b) ==
// crc32c(b, crc32c(a)).
uint32_t crc32c(std::span<const uint8_t> data, uint32_t crc = 0);

// The same from the table alone (tests compare the two).
uint32_t crc32c_portable(std::span<const uint8_t> data, uint32_t crc = 0);

}  // namespace deltaserve
