// Python's str operations on UTF-8 text, for the Jinja methods and filters: whitespace is
// Python's (Unicode) whitespace; case changes cover ASCII and Latin-1 letters (others are
// left as they are).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace deltaserve::model::jinja {

// str.strip / lstrip / rstrip: chars (code points) or, when absent, whitespace.
std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                  bool right);
// str.split / rsplit (sep absent: runs of whitespace, no empty parts).
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep,
                               int64_t maxsplit, bool from_right);
std::vector<std::string> split_lines(std::string_view s);
// str.replace; count < 0: every occurrence.
std::string replace(std::string_view s, std::string_view old, std::string_view with, int64_t count);
int64_t count_of(std::string_view s, std::string_view sub);
// "upper", "lower", "title", "capitalize", "swapcase".
std::string change_case(std::string_view s, std::string_view how);
// "isdigit", "isalpha", "isalnum", "isspace", "islower", "isupper", "isnumeric", "isdecimal".
bool char_class(std::string_view s, std::string_view which);

}  // namespace deltaserve::model::jinja
