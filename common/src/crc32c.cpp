#include "deltaserve/common/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace deltaserve {

namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected

std::array<uint32_t, 256> make_table() {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
        uint32_t c = i;
        for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
        t[i] = c;
    }
    return t;
}

const std::array<uint32_t, 256>& table() {
    static const std::array<uint32_t, 256> t = make_table();
    return t;
}

// The raw (not inverted) CRC register after `data`.
uint32_t table_update(uint32_t crc, const uint8_t* p, size_t n) {
    const auto& t = table();
    for (size_t i = 0; i < n; ++i) crc = t[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
    return crc;
}

#if defined(__x86_64__)

// Multiplication of two polynomials mod P (bit-reflected), and x^(8n) mod P: what shifting a
// CRC register past n zero bytes multiplies it by. Used to join the three streams.
uint32_t gf_multiply(uint32_t a, uint32_t b) {
    uint32_t product = 0;
    for (int i = 0; i < 32; ++i) {
        if (b & 0x80000000u) product ^= a;
        b <<= 1;
        a = (a & 1) ? (a >> 1) ^ kPoly : a >> 1;
    }
    return product;
}

uint32_t x_pow_8n(size_t n) {
    uint32_t result = 0x80000000u;  // x^0
    uint32_t square = 0x00800000u;  // x^8
    while (n != 0) {
        if (n & 1) result = gf_multiply(result, square);
        square = gf_multiply(square, square);
        n >>= 1;
    }
    return result;
}

// Bytes per stream in one round: long enough that the join's cost is small, short enough
// that the three streams stay in L1.
constexpr size_t kStride = 4096;

__attribute__((target("sse4.2"))) uint32_t hw_update(uint32_t crc, const uint8_t* p, size_t n) {
    uint64_t c0 = crc;
    if (n >= 3 * kStride) {
        static const uint32_t shift = x_pow_8n(kStride);
        while (n >= 3 * kStride) {
            uint64_t c1 = 0, c2 = 0;
            for (size_t i = 0; i < kStride; i += 8) {
                uint64_t a, b, c;
                std::memcpy(&a, p + i, 8);
                std::memcpy(&b, p + kStride + i, 8);
                std::memcpy(&c, p + 2 * kStride + i, 8);
                c0 = _mm_crc32_u64(c0, a);
                c1 = _mm_crc32_u64(c1, b);
                c2 = _mm_crc32_u64(c2, c);
            }
            // crc(A B C) = crc(A) * x^(8|BC|) + crc(B) * x^(8|C|) + crc(C), for raw registers.
            c0 = gf_multiply(
                     gf_multiply(static_cast<uint32_t>(c0), shift) ^ static_cast<uint32_t>(c1),
                     shift) ^
                 static_cast<uint32_t>(c2);
            p += 3 * kStride;
            n -= 3 * kStride;
        }
    }
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t v;
        std::memcpy(&v, p, 8);
        c0 = _mm_crc32_u64(c0, v);
    }
    uint32_t c = static_cast<uint32_t>(c0);
    for (; n > 0; ++p, --n) c = _mm_crc32_u8(c, *p);
    return c;
}

bool has_sse42() {
    static const bool yes = __builtin_cpu_supports("sse4.2");
    return yes;
}

#endif

}  // namespace

uint32_t crc32c(std::span<const uint8_t> data, uint32_t crc) {
#if defined(__x86_64__)
    if (has_sse42()) return ~hw_update(~crc, data.data(), data.size());
#endif
    return ~table_update(~crc, data.data(), data.size());
}

uint32_t crc32c_portable(std::span<const uint8_t> data, uint32_t crc) {
    return ~table_update(~crc, data.data(), data.size());
}

}  // namespace deltaserve
