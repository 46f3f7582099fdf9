// Unguessable ids (chat completion ids, session ids) from the kernel's CSPRNG (getrandom).
#pragma once

#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <string>

#include "deltaserve/common/status.h"

namespace deltaserve::api {

// Fills out with getrandom(2). Aborts if the kernel cannot give them (it blocks only before
// the pool is seeded, at boot).
inline void random_bytes(unsigned char* out, size_t bytes) {
    size_t got = 0;
    while (got < bytes) {
        const ssize_t n = getrandom(out + got, bytes - got, 0);
        DS_CHECK(n > 0 || errno == EINTR);
        if (n > 0) got += static_cast<size_t>(n);
    }
}

// A random non-zero 64-bit number (turn ids: no peer can guess another gateway's).
inline uint64_t random_u64() {
    uint64_t v = 0;
    while (v == 0) random_bytes(reinterpret_cast<unsigned char*>(&v), sizeof v);
    return v;
}

// prefix + 2 * bytes hex digits of getrandom(2).
inline std::string random_id(const char* prefix, size_t bytes = 16) {
    unsigned char raw[64];
    DS_CHECK(bytes <= sizeof raw);
    random_bytes(raw, bytes);
    std::string out = prefix;
    char hex[3];
    for (size_t i = 0; i < bytes; ++i) {
        std::snprintf(hex, sizeof hex, "%02x", raw[i]);
        out += hex;
    }
    return out;
}

}  // namespace deltaserve::api
