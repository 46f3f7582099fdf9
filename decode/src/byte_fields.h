// Fixed-size fields of decode's stored formats (session_record.cpp, session_bundle.cpp), in
// the machine's byte order (the formats say little-endian; this is x86-64): appended to a
// byte string, and read back without reading past its end. Private to decode/.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>

namespace deltaserve::decode {

// Appends v's bytes to out (a std::string or a std::vector<uint8_t>).
template <typename T, typename Out>
void put_field(Out& out, T v) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    out.insert(out.end(), b, b + sizeof(T));
}

template <typename Out>
void put_bytes(Out& out, const void* p, size_t n) {
    const auto* b = static_cast<const char*>(p);
    out.insert(out.end(), b, b + n);
}

// Reads fields off the front of s; a read past its end fails and takes nothing.
struct FieldReader {
    std::span<const uint8_t> s;
    template <typename T>
    bool get(T& v) {
        if (s.size() < sizeof(T)) return false;
        std::memcpy(&v, s.data(), sizeof(T));
        s = s.subspan(sizeof(T));
        return true;
    }
    bool take(uint64_t n, std::span<const uint8_t>& out) {
        if (n > s.size()) return false;
        out = s.subspan(0, n);
        s = s.subspan(n);
        return true;
    }
};

}  // namespace deltaserve::decode
