// Turning generated tokens into the text a client sees: whole UTF-8 characters only, and
// stop strings held back until they can be ruled out (then cut off).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace deltaserve::decode {

// Length of the longest prefix of text that does not end inside a UTF-8 character.
size_t complete_utf8_prefix(std::string_view text);

class StopScanner {
  public:
    explicit StopScanner(std::vector<std::string> stop);
    // Appends a piece; returns true when a stop string was found (text() is cut before it).
    bool add(std::string_view piece);
    // The next text that may be released (empty if none yet); final releases the rest.
    std::string_view release(bool final);
    const std::string& text() const { return text_; }

  private:
    std::vector<std::string> stop_;
    size_t hold_ = 0;
    std::string text_;
    size_t released_ = 0;
};

}  // namespace deltaserve::decode
