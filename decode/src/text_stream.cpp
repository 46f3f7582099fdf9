#include "deltaserve/decode/text_stream.h"

#include <algorithm>

namespace deltaserve::decode {

size_t complete_utf8_prefix(std::string_view text) {
    // Walk back over continuation bytes to the last lead byte; keep it if its sequence is whole.
    size_t i = text.size();
    int back = 0;
    while (i > 0 && back < 4 && (static_cast<unsigned char>(text[i - 1]) & 0xC0) == 0x80) {
        --i;
        ++back;
    }
    if (i == 0) return text.size();
    const auto lead = static_cast<unsigned char>(text[i - 1]);
    const int need = lead < 0x80           ? 0
                     : (lead >> 5) == 0x6  ? 1
                     : (lead >> 4) == 0xE  ? 2
                     : (lead >> 3) == 0x1E ? 3
                                           : 0;
    return back >= need ? text.size() : i - 1;
}

StopScanner::StopScanner(std::vector<std::string> stop) : stop_(std::move(stop)) {
    for (const std::string& s : stop_) hold_ = std::max(hold_, s.size() - 1);
}

bool StopScanner::add(std::string_view piece) {
    text_ += piece;
    for (const std::string& s : stop_) {
        const size_t at = text_.find(s, std::max<size_t>(released_, s.size()) - s.size());
        if (at != std::string::npos) {
            text_.resize(at);
            return true;
        }
    }
    return false;
}

std::string_view StopScanner::release(bool final) {
    size_t end = final ? text_.size() : (text_.size() > hold_ ? text_.size() - hold_ : 0);
    end = std::max(released_, complete_utf8_prefix(std::string_view(text_).substr(0, end)));
    std::string_view out = std::string_view(text_).substr(released_, end - released_);
    released_ = end;
    return out;
}

}  // namespace deltaserve::decode
