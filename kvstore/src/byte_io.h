// Little-endian byte writing and bounds-checked reading for shipped cache parts. Private to
// kvstore/.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

namespace deltaserve::kvstore {

class ByteWriter {
  public:
    explicit ByteWriter(std::vector<uint8_t>& out) : out_(out) {}
    void i32(int32_t v) { bytes(&v, sizeof(v)); }
    void bytes(const void* p, size_t n) {
        const auto* b = static_cast<const uint8_t*>(p);
        out_.insert(out_.end(), b, b + n);
    }

  private:
    std::vector<uint8_t>& out_;
};

// Reads fail (return false) instead of running past the end.
class ByteReader {
  public:
    explicit ByteReader(std::span<const uint8_t> in) : in_(in) {}
    bool i32(int32_t& v) { return bytes(&v, sizeof(v)); }
    bool bytes(void* p, size_t n) {
        if (n > in_.size() - at_) return false;
        if (n == 0) return true;  // (p may be null: memcpy takes no null pointer)
        std::memcpy(p, in_.data() + at_, n);
        at_ += n;
        return true;
    }
    // A view of the next n bytes, or an empty span when fewer remain.
    std::span<const uint8_t> take(size_t n) {
        if (n > in_.size() - at_) return {};
        auto s = in_.subspan(at_, n);
        at_ += n;
        return s;
    }
    size_t remaining() const { return in_.size() - at_; }

  private:
    std::span<const uint8_t> in_;
    size_t at_ = 0;
};

}  // namespace deltaserve::kvstore
