#include "deltaserve/transport/kv_stream.h"

#include <cstring>

namespace deltaserve::transport {

namespace {

constexpr char kMagic[4] = {'D', 'S', 'S', 'T'};
constexpr uint8_t kVersion = 2;  // 2: the kChallenge / kProof handshake
constexpr size_t kMaxText = 1024;

template <typename T>
void put(std::vector<std::byte>& out, T v) {
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    out.insert(out.end(), p, p + sizeof(T));  // little-endian hosts only (x86-64, aarch64)
}

void put_text(std::vector<std::byte>& out, const std::string& s) {
    put<uint16_t>(out, static_cast<uint16_t>(s.size()));
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    out.insert(out.end(), p, p + s.size());
}

class Reader {
  public:
    explicit Reader(std::span<const std::byte> b) : b_(b) {}
    template <typename T>
    bool get(T& v) {
        if (b_.size() - at_ < sizeof(T)) return false;
        std::memcpy(&v, b_.data() + at_, sizeof(T));
        at_ += sizeof(T);
        return true;
    }
    bool get_text(std::string& s) {
        uint16_t n = 0;
        if (!get(n) || b_.size() - at_ < n) return false;
        s.assign(reinterpret_cast<const char*>(b_.data() + at_), n);
        at_ += n;
        return true;
    }
    bool done() const { return at_ == b_.size(); }

  private:
    std::span<const std::byte> b_;
    size_t at_ = 0;
};

}  // namespace

Result<std::vector<std::byte>> encode_stream_header(const StreamHeader& h) {
    if (h.session.size() > kMaxText || h.message.size() > kMaxText) {
        return invalid_argument("a stream header's session id or message is over " +
                                std::to_string(kMaxText) + " bytes");
    }
    std::vector<std::byte> out;
    out.reserve(26 + h.session.size() + h.message.size());
    for (char c : kMagic) out.push_back(static_cast<std::byte>(c));
    put<uint8_t>(out, kVersion);
    put<uint8_t>(out, static_cast<uint8_t>(h.kind));
    put<uint64_t>(out, h.turn);
    put<int32_t>(out, h.n_tokens);
    put<int32_t>(out, h.token);
    put_text(out, h.session);
    put_text(out, h.message);
    return out;
}

Result<StreamHeader> decode_stream_header(std::span<const std::byte> bytes) {
    if (bytes.size() < 4 || std::memcmp(bytes.data(), kMagic, 4) != 0) {
        return invalid_argument("not a KV stream message (bad magic)");
    }
    Reader r(bytes.subspan(4));
    uint8_t version = 0, kind = 0;
    StreamHeader h;
    if (!r.get(version) || !r.get(kind)) return data_loss("a KV stream header is cut short");
    if (version != kVersion) {
        return invalid_argument("KV stream version " + std::to_string(version) +
                                "; this build speaks version " + std::to_string(kVersion));
    }
    if (kind < static_cast<uint8_t>(StreamKind::kBegin) ||
        kind > static_cast<uint8_t>(StreamKind::kProof)) {
        return invalid_argument("unknown KV stream message kind " + std::to_string(kind));
    }
    h.kind = static_cast<StreamKind>(kind);
    if (!r.get(h.turn) || !r.get(h.n_tokens) || !r.get(h.token) || !r.get_text(h.session) ||
        !r.get_text(h.message)) {
        return data_loss("a KV stream header is cut short");
    }
    if (!r.done()) return data_loss("a KV stream header has trailing bytes");
    if (h.n_tokens < 0) return invalid_argument("a KV stream header with a negative token count");
    return h;
}

}  // namespace deltaserve::transport
