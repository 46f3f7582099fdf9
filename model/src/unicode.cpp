#include "unicode.h"

#include <algorithm>
#include <array>

#include "deltaserve/model/tokenizer.h"

namespace deltaserve::model::unicode {
namespace {

bool in_ranges(const CodepointRange* ranges, size_t count, uint32_t cp) {
    const CodepointRange* end = ranges + count;
    // First range whose last >= cp.
    const CodepointRange* it = std::lower_bound(
        ranges, end, cp, [](const CodepointRange& r, uint32_t v) { return r.last < v; });
    return it != end && it->first <= cp;
}

struct ByteMap {
    std::array<uint32_t, 256> to_cp{};
    std::array<int16_t, 324> to_byte{};  // code points 0..323 cover every mapped byte

    ByteMap() {
        to_byte.fill(-1);
        uint32_t next = 256;
        for (int b = 0; b < 256; ++b) {
            const bool self = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
            to_cp[b] = self ? static_cast<uint32_t>(b) : next++;
            to_byte[to_cp[b]] = static_cast<int16_t>(b);
        }
    }
};

const ByteMap& byte_map() {
    static const ByteMap map;
    return map;
}

}  // namespace

bool is_letter(uint32_t cp) {
    if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
    return in_ranges(detail::kLetterRanges, detail::kLetterRangesCount, cp);
}

bool is_number(uint32_t cp) {
    if (cp < 0x80) return cp >= '0' && cp <= '9';
    return in_ranges(detail::kNumberRanges, detail::kNumberRangesCount, cp);
}

bool is_whitespace(uint32_t cp) {
    if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
    switch (cp) {
        case 0x0085:
        case 0x00A0:
        case 0x1680:
        case 0x2028:
        case 0x2029:
        case 0x202F:
        case 0x205F:
        case 0x3000:
            return true;
        default:
            return cp >= 0x2000 && cp <= 0x200A;
    }
}

Result<std::vector<uint32_t>> decode_utf8(std::string_view text) {
    const int64_t bad = find_invalid_utf8(text);
    if (bad >= 0) {
        return invalid_argument("invalid UTF-8 at byte offset " + std::to_string(bad));
    }
    std::vector<uint32_t> cps;
    cps.reserve(text.size());
    const auto* s = reinterpret_cast<const unsigned char*>(text.data());
    for (size_t i = 0; i < text.size();) {
        const size_t len = utf8_sequence_length(s[i]);
        uint32_t cp = len == 1 ? s[i] : s[i] & (0x7F >> len);
        for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (s[i + k] & 0x3F);
        cps.push_back(cp);
        i += len;
    }
    return cps;
}

void append_utf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
        out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
        out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
        out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
        out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
        out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
        out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
        out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
}

std::string encode_utf8(std::span<const uint32_t> cps) {
    std::string out;
    out.reserve(cps.size());
    for (uint32_t cp : cps) append_utf8(cp, &out);
    return out;
}

std::string to_valid_utf8(std::string_view bytes) {
    if (find_invalid_utf8(bytes) < 0) return std::string(bytes);
    const auto* s = reinterpret_cast<const unsigned char*>(bytes.data());
    const size_t n = bytes.size();
    std::string out;
    out.reserve(n + 8);
    for (size_t i = 0; i < n;) {
        const unsigned char c = s[i];
        // The sequence's length and its second byte's range (no overlongs, surrogates or
        // values past U+10FFFF); 0: c starts no sequence.
        size_t len = 0;
        unsigned char lo = 0x80, hi = 0xBF;
        if (c < 0x80) {
            len = 1;
        } else if (c >= 0xC2 && c <= 0xDF) {
            len = 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        }
        size_t k = 1;  // bytes of the longest valid prefix of a sequence (the maximal subpart)
        while (len > 0 && k < len && i + k < n && s[i + k] >= (k == 1 ? lo : 0x80) &&
               s[i + k] <= (k == 1 ? hi : 0xBF)) {
            ++k;
        }
        if (len > 0 && k == len) {
            out.append(bytes.substr(i, len));
        } else {
            out += "\xEF\xBF\xBD";  // U+FFFD
        }
        i += k;
    }
    return out;
}

uint32_t byte_to_codepoint(uint8_t byte) { return byte_map().to_cp[byte]; }

int codepoint_to_byte(uint32_t cp) {
    const auto& map = byte_map().to_byte;
    return cp < map.size() ? map[cp] : -1;
}

}  // namespace deltaserve::model::unicode
