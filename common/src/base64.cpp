#include "deltaserve/common/base64.h"

#include <array>
#include <cstdint>

namespace deltaserve {
namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

constexpr std::array<int8_t, 256> make_values() {
    std::array<int8_t, 256> v{};
    for (auto& x : v) x = -1;
    for (int i = 0; i < 64; ++i) v[static_cast<uint8_t>(kAlphabet[i])] = static_cast<int8_t>(i);
    return v;
}
constexpr std::array<int8_t, 256> kValues = make_values();

}  // namespace

std::string base64_encode(std::string_view bytes) {
    std::string out;
    out.reserve((bytes.size() + 2) / 3 * 4);
    size_t i = 0;
    for (; i + 3 <= bytes.size(); i += 3) {
        const uint32_t w = static_cast<uint8_t>(bytes[i]) << 16 |
                           static_cast<uint8_t>(bytes[i + 1]) << 8 |
                           static_cast<uint8_t>(bytes[i + 2]);
        out += kAlphabet[w >> 18];
        out += kAlphabet[(w >> 12) & 63];
        out += kAlphabet[(w >> 6) & 63];
        out += kAlphabet[w & 63];
    }
    const size_t rest = bytes.size() - i;
    if (rest > 0) {
        uint32_t w = static_cast<uint8_t>(bytes[i]) << 16;
        if (rest == 2) w |= static_cast<uint8_t>(bytes[i + 1]) << 8;
        out += kAlphabet[w >> 18];
        out += kAlphabet[(w >> 12) & 63];
        out += rest == 2 ? kAlphabet[(w >> 6) & 63] : '=';
        out += '=';
    }
    return out;
}

Result<std::string> base64_decode(std::string_view text) {
    if (text.size() % 4 != 0) {
        return invalid_argument("base64: a length of " + std::to_string(text.size()) +
                                " is not a multiple of 4");
    }
    std::string out;
    out.reserve(text.size() / 4 * 3);
    for (size_t i = 0; i < text.size(); i += 4) {
        const bool last = i + 4 == text.size();
        const size_t pad =
            last ? (text[i + 3] == '=') + (text[i + 2] == '=' && text[i + 3] == '=') : 0;
        uint32_t w = 0;
        for (size_t k = 0; k < 4; ++k) {
            const int8_t v = k >= 4 - pad ? 0 : kValues[static_cast<uint8_t>(text[i + k])];
            if (v < 0) {
                return invalid_argument("base64: byte " + std::to_string(i + k) +
                                        " is not of the alphabet");
            }
            w = w << 6 | static_cast<uint32_t>(v);
        }
        if ((pad == 1 && (w & 0xff) != 0) || (pad == 2 && (w & 0xffff) != 0)) {
            return invalid_argument("base64: the bits under the padding at byte " +
                                    std::to_string(i) + " are not zero");
        }
        out += static_cast<char>(w >> 16);
        if (pad < 2) out += static_cast<char>((w >> 8) & 0xff);
        if (pad < 1) out += static_cast<char>(w & 0xff);
    }
    return out;
}

}  // namespace deltaserve
