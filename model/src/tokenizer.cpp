#include "deltaserve/model/tokenizer.h"

#include <algorithm>

#include "pre_tokenizer.h"
#include "unicode.h"

namespace deltaserve::model {

std::string Tokenizer::decode(std::span<const int32_t> ids, bool render_special) const {
    std::string out;
    std::string bytes;  // a run of byte tokens (<0xXX>)
    // HF's ByteFallback decoder: a run that is not valid UTF-8 as a whole is one U+FFFD per
    // byte. Tokens rendered as nothing (skipped control tokens) do not end a run.
    auto end_run = [&] {
        if (find_invalid_utf8(bytes) < 0) {
            out += bytes;
        } else {
            for (size_t i = 0; i < bytes.size(); ++i) out += "\xEF\xBF\xBD";
        }
        bytes.clear();
    };
    int32_t prev = -1;
    for (int32_t id : ids) {
        const std::string piece = token_to_piece(id, prev, render_special);
        if (token_type(vocab_, id) == TokenType::kByte) {
            bytes += piece;
        } else if (!piece.empty()) {
            end_run();
            out += piece;
        }
        prev = id;
    }
    end_run();
    return unicode::to_valid_utf8(out);  // byte-level pieces may leave partial sequences
}

bool Tokenizer::is_eog(int32_t id) const {
    if (id == vocab_.eos_id) return true;
    return std::find(vocab_.eog_ids.begin(), vocab_.eog_ids.end(), id) != vocab_.eog_ids.end();
}

int64_t find_invalid_utf8(std::string_view text) {
    const auto* s = reinterpret_cast<const unsigned char*>(text.data());
    const size_t n = text.size();
    size_t i = 0;
    while (i < n) {
        const unsigned char c = s[i];
        int len;
        uint32_t cp;
        if (c < 0x80) {
            ++i;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            len = 2;
            cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3;
            cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            len = 4;
            cp = c & 0x07;
        } else {
            return static_cast<int64_t>(i);
        }
        if (i + len > n) return static_cast<int64_t>(i);
        for (int k = 1; k < len; ++k) {
            if ((s[i + k] & 0xC0) != 0x80) return static_cast<int64_t>(i);
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        // Overlong forms, surrogates and values past U+10FFFF are invalid.
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
            (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) {
            return static_cast<int64_t>(i);
        }
        i += len;
    }
    return -1;
}

}  // namespace deltaserve::model
