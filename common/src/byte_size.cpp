#include "deltaserve/common/byte_size.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <string>

namespace deltaserve {

namespace {
constexpr const char* kUnits = "KMGT";
}  // namespace

Result<uint64_t> parse_byte_size(std::string_view text) {
    const auto bad = [&] {
        return invalid_argument("'" + std::string(text.substr(0, 64)) +
                                "' is not a size (examples: 4GiB, 512M, 65536)");
    };
    size_t i = 0;
    double value = 0.0;
    bool digits = false, point = false;
    double scale = 0.1;
    for (; i < text.size(); ++i) {
        const char c = text[i];
        if (std::isdigit(static_cast<unsigned char>(c))) {
            digits = true;
            if (point) {
                value += (c - '0') * scale;
                scale /= 10;
            } else {
                value = value * 10 + (c - '0');
            }
        } else if (c == '.' && !point) {
            point = true;
        } else {
            break;
        }
        if (value >= 1e16) return bad();
    }
    if (!digits) return bad();
    while (i < text.size() && text[i] == ' ') ++i;
    double unit = 1.0;
    if (i < text.size()) {
        const char u = static_cast<char>(std::toupper(static_cast<unsigned char>(text[i])));
        for (const char* p = kUnits; *p != '\0'; ++p) {
            unit *= 1024.0;
            if (*p == u) {
                ++i;
                if (i < text.size() && text[i] == 'i') ++i;
                break;
            }
            if (p[1] == '\0') unit = 1.0;  // not a unit letter
        }
        if (i < text.size() && (text[i] == 'B' || text[i] == 'b')) ++i;
    }
    if (i != text.size()) return bad();
    const double bytes = std::floor(value * unit);
    if (bytes >= std::ldexp(1.0, 50)) return bad();
    return static_cast<uint64_t>(bytes);
}

std::string format_byte_size(uint64_t bytes) {
    if (bytes < 1024) return std::to_string(bytes) + " B";
    double v = static_cast<double>(bytes);
    int unit = -1;
    while (v >= 1024.0 && unit < 3) {
        v /= 1024.0;
        ++unit;
    }
    char out[32];
    std::snprintf(out, sizeof(out), v < 10 ? "%.1f %ciB" : "%.0f %ciB", v, kUnits[unit]);
    return out;
}

}  // namespace deltaserve
