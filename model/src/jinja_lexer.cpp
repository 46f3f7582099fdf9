// Jinja's lexer with trim_blocks and lstrip_blocks, as jinja2 3.1's tokeniter applies them.
#include "jinja_lexer.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "unicode.h"

namespace deltaserve::model::jinja {
namespace {

bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

// "\r\n" and "\r" as "\n", as jinja2 normalizes template text and string literals.
std::string normalize_newlines(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '\r') {
            out.push_back('\n');
            if (i + 1 < s.size() && s[i + 1] == '\n') ++i;
        } else {
            out.push_back(s[i]);
        }
    }
    return out;
}

int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

// A string literal's body with Python's escapes decoded (jinja2 decodes it as
// "unicode-escape"; unknown escapes keep their backslash).
Result<std::string> decode_string(std::string_view body, int line) {
    const std::string s = normalize_newlines(body);
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] != '\\' || i + 1 == s.size()) {
            out.push_back(s[i]);
            continue;
        }
        const char c = s[++i];
        const auto hex = [&](int digits) -> Result<uint32_t> {
            uint32_t v = 0;
            for (int k = 0; k < digits; ++k) {
                const int h = i + 1 < s.size() ? hex_value(s[i + 1]) : -1;
                if (h < 0) {
                    return invalid_argument("line " + std::to_string(line) +
                                            ": a truncated \\x, \\u or \\U escape");
                }
                v = v * 16 + static_cast<uint32_t>(h);
                ++i;
            }
            return v;
        };
        switch (c) {
            case '\n':
                break;
            case '\\':
            case '\'':
            case '"':
                out.push_back(c);
                break;
            case 'a':
                out.push_back('\a');
                break;
            case 'b':
                out.push_back('\b');
                break;
            case 'f':
                out.push_back('\f');
                break;
            case 'n':
                out.push_back('\n');
                break;
            case 'r':
                out.push_back('\r');
                break;
            case 't':
                out.push_back('\t');
                break;
            case 'v':
                out.push_back('\v');
                break;
            case 'x':
            case 'u':
            case 'U': {
                DS_ASSIGN_OR_RETURN(uint32_t cp, hex(c == 'x' ? 2 : c == 'u' ? 4 : 8));
                if ((cp >= 0xD800 && cp < 0xE000) || cp > 0x10FFFF) {
                    return invalid_argument("line " + std::to_string(line) +
                                            ": a string escape of a surrogate or past U+10FFFF");
                }
                unicode::append_utf8(cp, &out);
                break;
            }
            case 'N':
                return invalid_argument("line " + std::to_string(line) +
                                        ": the \\N{...} escape is not supported");
            default:
                if (c >= '0' && c <= '7') {
                    uint32_t v = static_cast<uint32_t>(c - '0');
                    for (int k = 0; k < 2 && i + 1 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '7';
                         ++k) {
                        v = v * 8 + static_cast<uint32_t>(s[++i] - '0');
                    }
                    unicode::append_utf8(v, &out);
                } else {
                    out.push_back('\\');
                    out.push_back(c);
                }
        }
    }
    return out;
}

constexpr const char* kOperators[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/",
                                      "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                      "<",  ">",  "=",  ".",  ":",  "|",  ",", ";"};

class Lexer {
  public:
    explicit Lexer(std::string_view src) : src_(src) {}

    Result<std::vector<Token>> run() {
        while (pos_ < src_.size()) {
            const size_t open = next_tag(pos_);
            std::string_view text = src_.substr(pos_, open - pos_);
            if (open == src_.size()) {
                emit_text(text);
                break;
            }
            const char kind = src_[open + 1];  // '{', '%' or '#'
            const char sign = open + 2 < src_.size() ? src_[open + 2] : '\0';
            if (sign == '-') {
                size_t n = text.size();
                while (n > 0 && is_space(text[n - 1])) --n;
                text = text.substr(0, n);
            } else if (sign != '+' && kind != '{') {
                text = lstrip_block(text);
            }
            emit_text(text);
            line_ += count_lines(src_.substr(pos_, open - pos_));
            pos_ = open + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
            if (kind == '#') {
                DS_RETURN_IF_ERROR(comment());
            } else if (kind == '%' && is_raw_begin()) {
                DS_RETURN_IF_ERROR(raw());
            } else {
                DS_RETURN_IF_ERROR(tag(kind == '{'));
            }
        }
        tokens_.push_back({TokenKind::kEnd, "", line_});
        return std::move(tokens_);
    }

  private:
    size_t next_tag(size_t from) const {
        for (size_t i = from; i + 1 < src_.size(); ++i) {
            if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#'))
                return i;
        }
        return src_.size();
    }

    static int count_lines(std::string_view s) {
        int n = 0;
        for (char c : s) n += c == '\n';
        return n;
    }

    // lstrip_blocks: the spaces and tabs between the line's start and a block or comment tag.
    std::string_view lstrip_block(std::string_view text) const {
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
        if (l_pos == 0 && !line_starting_) return text;
        if (l_pos == text.size()) return text;
        for (size_t i = l_pos; i < text.size(); ++i) {
            if (!is_space(text[i])) return text;
        }
        return text.substr(0, l_pos);
    }

    void emit_text(std::string_view text) {
        if (text.empty()) return;
        tokens_.push_back({TokenKind::kText, normalize_newlines(text), line_});
    }

    // After a tag's end: "-" eats the whitespace that follows, else trim_blocks one newline
    // (block and comment tags only). line_starting_ as jinja2 keeps it for lstrip_blocks.
    void after_end(bool minus, bool trim_newline) {
        if (minus) {
            const size_t from = pos_;
            while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
            line_ += count_lines(src_.substr(from, pos_ - from));
            line_starting_ = pos_ > from && src_[pos_ - 1] == '\n';
        } else if (trim_newline && pos_ < src_.size() && src_[pos_] == '\n') {
            ++pos_;
            ++line_;
            line_starting_ = true;
        } else {
            line_starting_ = false;
        }
    }

    Status comment() {
        for (size_t i = pos_; i + 1 < src_.size(); ++i) {
            if (src_[i] == '#' && src_[i + 1] == '}') {
                const bool minus = i > pos_ && src_[i - 1] == '-';
                line_ += count_lines(src_.substr(pos_, i - pos_));
                pos_ = i + 2;
                after_end(minus, true);
                return Status::ok_status();
            }
        }
        return invalid_argument("line " + std::to_string(line_) + ": an unterminated comment");
    }

    // "{% raw %}" (the "{%" and any sign already consumed).
    bool is_raw_begin() const {
        size_t i = pos_;
        while (i < src_.size() && is_space(src_[i])) ++i;
        if (src_.compare(i, 3, "raw") != 0) return false;
        i += 3;
        while (i < src_.size() && is_space(src_[i])) ++i;
        if (i < src_.size() && src_[i] == '-') ++i;
        return src_.compare(i, 2, "%}") == 0;
    }

    Status raw() {
        size_t i = src_.find("%}", pos_);
        const bool minus_begin = i > 0 && src_[i - 1] == '-';
        pos_ = i + 2;
        after_end(minus_begin, true);
        for (size_t open = src_.find("{%", pos_); open != std::string_view::npos;
             open = src_.find("{%", open + 2)) {
            size_t j = open + 2;
            const char sign = j < src_.size() ? src_[j] : '\0';
            if (sign == '-' || sign == '+') ++j;
            while (j < src_.size() && is_space(src_[j])) ++j;
            if (src_.compare(j, 6, "endraw") != 0) continue;
            j += 6;
            while (j < src_.size() && is_space(src_[j])) ++j;
            const bool minus_end = j < src_.size() && src_[j] == '-';
            if (minus_end) ++j;
            if (src_.compare(j, 2, "%}") != 0) continue;
            std::string_view body = src_.substr(pos_, open - pos_);
            if (sign == '-') {
                size_t n = body.size();
                while (n > 0 && is_space(body[n - 1])) --n;
                body = body.substr(0, n);
            } else if (sign != '+') {
                body = lstrip_block(body);
            }
            emit_text(body);
            line_ += count_lines(src_.substr(pos_, j - pos_));
            pos_ = j + 2;
            after_end(minus_end, true);
            return Status::ok_status();
        }
        return invalid_argument("line " + std::to_string(line_) + ": a raw block without endraw");
    }

    Status tag(bool variable) {
        tokens_.push_back({variable ? TokenKind::kVarBegin : TokenKind::kBlockBegin, "", line_});
        int depth = 0;
        while (true) {
            while (pos_ < src_.size() && is_space(src_[pos_])) {
                line_ += src_[pos_] == '\n';
                ++pos_;
            }
            if (pos_ >= src_.size()) {
                return invalid_argument("line " + std::to_string(line_) + ": an unterminated " +
                                        (variable ? "{{ ... }}" : "{% ... %}"));
            }
            if (depth == 0) {
                const char* end = variable ? "}}" : "%}";
                const bool minus = src_.compare(pos_, 3, std::string("-") + end) == 0;
                const bool plus = !variable && src_.compare(pos_, 3, "+%}") == 0;
                if (minus || plus || src_.compare(pos_, 2, end) == 0) {
                    pos_ += (minus || plus) ? 3 : 2;
                    tokens_.push_back(
                        {variable ? TokenKind::kVarEnd : TokenKind::kBlockEnd, "", line_});
                    after_end(minus, !variable && !plus);
                    return Status::ok_status();
                }
            }
            DS_RETURN_IF_ERROR(token(depth));
        }
    }

    Status token(int& depth) {
        const char c = src_[pos_];
        if (is_name_start(c)) {
            const size_t b = pos_;
            while (pos_ < src_.size() && is_name_char(src_[pos_])) ++pos_;
            tokens_.push_back({TokenKind::kName, std::string(src_.substr(b, pos_ - b)), line_});
            return Status::ok_status();
        }
        if (is_digit(c)) return number();
        if (c == '\'' || c == '"') {
            size_t i = pos_ + 1;
            while (i < src_.size() && src_[i] != c) i += src_[i] == '\\' ? 2 : 1;
            if (i >= src_.size()) {
                return invalid_argument("line " + std::to_string(line_) +
                                        ": an unterminated string literal");
            }
            DS_ASSIGN_OR_RETURN(std::string s,
                                decode_string(src_.substr(pos_ + 1, i - pos_ - 1), line_));
            line_ += count_lines(src_.substr(pos_, i - pos_));
            tokens_.push_back({TokenKind::kString, std::move(s), line_});
            pos_ = i + 1;
            return Status::ok_status();
        }
        for (const char* op : kOperators) {
            const size_t n = std::strlen(op);
            if (src_.compare(pos_, n, op) != 0) continue;
            if (n == 1 && (c == '(' || c == '[' || c == '{')) ++depth;
            if (n == 1 && (c == ')' || c == ']' || c == '}')) {
                if (depth == 0) {
                    return invalid_argument("line " + std::to_string(line_) + ": unexpected '" +
                                            std::string(1, c) + "'");
                }
                --depth;
            }
            tokens_.push_back({TokenKind::kOperator, op, line_});
            pos_ += n;
            return Status::ok_status();
        }
        return invalid_argument("line " + std::to_string(line_) + ": unexpected character '" +
                                std::string(1, c) + "'");
    }

    // Digits with single underscores between them, from pos_; "" when none.
    std::string digits() {
        std::string out;
        while (pos_ < src_.size() && is_digit(src_[pos_])) {
            out.push_back(src_[pos_++]);
            if (pos_ + 1 < src_.size() && src_[pos_] == '_' && is_digit(src_[pos_ + 1])) ++pos_;
        }
        return out;
    }

    Status number() {
        // jinja2's float pattern does not start right after a '.' (so "x.0.1" is two lookups).
        const bool after_dot = pos_ > 0 && src_[pos_ - 1] == '.';
        std::string text = digits();
        bool is_float = false;
        if (!after_dot && pos_ + 1 < src_.size() && src_[pos_] == '.' && is_digit(src_[pos_ + 1])) {
            ++pos_;
            text += "." + digits();
            is_float = true;
        }
        if (!after_dot && pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
            size_t j = pos_ + 1;
            if (j < src_.size() && (src_[j] == '+' || src_[j] == '-')) ++j;
            if (j < src_.size() && is_digit(src_[j])) {
                text += 'e';
                if (src_[pos_ + 1] == '-') text += '-';
                pos_ = j;
                text += digits();
                is_float = true;
            }
        }
        Token t{is_float ? TokenKind::kFloat : TokenKind::kInt, text, line_};
        if (is_float) {
            t.float_value = std::strtod(text.c_str(), nullptr);
        } else {
            errno = 0;
            char* end = nullptr;
            const long long v = std::strtoll(text.c_str(), &end, 10);
            if (errno == ERANGE) {
                return invalid_argument("line " + std::to_string(line_) +
                                        ": an integer literal past 64 bits");
            }
            t.int_value = v;
        }
        tokens_.push_back(std::move(t));
        return Status::ok_status();
    }

    std::string_view src_;
    size_t pos_ = 0;
    int line_ = 1;
    bool line_starting_ = true;
    std::vector<Token> tokens_;
};

}  // namespace

Result<std::vector<Token>> tokenize(std::string_view source) { return Lexer(source).run(); }

}  // namespace deltaserve::model::jinja
