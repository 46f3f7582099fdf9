// Stored KV blocks: encoding and checked parsing (kv_block.h has the layout).
#include "deltaserve/kvstore/kv_block.h"

#include <bit>
#include <cstring>
#include <string>

#include "deltaserve/common/chain_hash.h"
#include "deltaserve/common/crc32c.h"

namespace deltaserve::kvstore {

namespace {

constexpr uint8_t kMagic[4] = {'D', 'S', 'K', 'B'};
constexpr size_t kFixedBytes = 64;
static_assert(std::endian::native == std::endian::little, "blocks are written as in memory");

template <typename T>
void put(std::vector<uint8_t>& out, T v) {
    uint8_t b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    out.insert(out.end(), b, b + sizeof(T));
}

// Reads little-endian values, failing (not reading) past the end.
class Reader {
  public:
    explicit Reader(std::span<const uint8_t> b) : b_(b) {}
    template <typename T>
    bool get(T& v) {
        if (b_.size() - at_ < sizeof(T)) return false;
        std::memcpy(&v, b_.data() + at_, sizeof(T));
        at_ += sizeof(T);
        return true;
    }
    bool bytes(void* p, size_t n) {
        if (b_.size() - at_ < n) return false;
        if (n > 0) std::memcpy(p, b_.data() + at_, n);
        at_ += n;
        return true;
    }
    size_t at() const { return at_; }

  private:
    std::span<const uint8_t> b_;
    size_t at_ = 0;
};

bool known_codec(uint8_t c) {
    return c == static_cast<uint8_t>(KvCodecId::kRows) ||
           c == static_cast<uint8_t>(KvCodecId::kDeltaKv);
}

// The header's size for a block of n tokens, L layers and s bytes of codec state.
size_t header_size(size_t n, size_t layers, size_t s) {
    return kFixedBytes + s + 4 * n + 12 * layers + 4;
}

Status refuse(KvBlockFault* out, KvBlockFault why, Status status) {
    if (out != nullptr) *out = why;
    return status;
}

}  // namespace

std::string_view kv_block_fault_name(KvBlockFault fault) {
    switch (fault) {
        case KvBlockFault::kNone:
            return "none";
        case KvBlockFault::kFormat:
            return "format";
        case KvBlockFault::kVersion:
            return "version";
        case KvBlockFault::kChecksum:
            return "checksum";
        case KvBlockFault::kFingerprint:
            return "fingerprint";
        case KvBlockFault::kKey:
            return "key";
    }
    return "unknown";
}

Result<std::vector<uint8_t>> encode_kv_block(const KvBlockMeta& m,
                                             std::span<const std::span<const uint8_t>> parts) {
    const size_t n = m.tokens.size(), layers = m.layer_error.size();
    if (!known_codec(static_cast<uint8_t>(m.codec))) return invalid_argument("KV block: no codec");
    if (m.begin < 0 || m.end <= m.begin || m.end - m.begin > kKvBlockMaxTokens ||
        static_cast<size_t>(m.end - m.begin) != n) {
        return invalid_argument("KV block: tokens [" + std::to_string(m.begin) + ", " +
                                std::to_string(m.end) + ") with " + std::to_string(n) + " ids");
    }
    if (layers < 1 || layers > kKvBlockMaxLayers || parts.size() != layers) {
        return invalid_argument("KV block: " + std::to_string(parts.size()) + " parts for " +
                                std::to_string(layers) + " layers");
    }
    if (m.codec_state.size() > kKvBlockMaxCodecState)
        return invalid_argument("KV block: codec state too large");
    uint64_t payload = 0;
    for (const auto& p : parts) payload += p.size();
    const size_t head = header_size(n, layers, m.codec_state.size());
    std::vector<uint8_t> out;
    out.reserve(head + payload);
    out.insert(out.end(), kMagic, kMagic + 4);
    put<uint16_t>(out, kKvBlockVersion);
    put<uint8_t>(out, static_cast<uint8_t>(m.codec));
    put<uint8_t>(out, 0);
    put<uint32_t>(out, static_cast<uint32_t>(head));
    put<uint32_t>(out, static_cast<uint32_t>(layers));
    put<uint64_t>(out, m.fingerprint);
    put<uint64_t>(out, hash_tokens(m.parent, m.tokens));
    put<uint64_t>(out, m.parent);
    put<int32_t>(out, m.begin);
    put<int32_t>(out, m.end);
    put<uint64_t>(out, payload);
    uint32_t crc = 0;
    for (const auto& p : parts) crc = crc32c(p, crc);
    put<uint32_t>(out, crc);
    put<uint32_t>(out, static_cast<uint32_t>(m.codec_state.size()));
    out.insert(out.end(), m.codec_state.begin(), m.codec_state.end());
    for (int32_t t : m.tokens) put<int32_t>(out, t);
    for (const auto& p : parts) put<uint64_t>(out, p.size());
    for (float e : m.layer_error) put<float>(out, e);
    put<uint32_t>(out, crc32c(out));
    DS_CHECK(out.size() == head, "KV block header size");
    for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
}

Result<KvBlockMeta> parse_kv_block_header(std::span<const uint8_t> bytes, uint64_t fingerprint,
                                          KvBlockFault* fault) {
    const auto bad = [&](const std::string& why) {
        return refuse(fault, KvBlockFault::kFormat, data_loss("KV block: " + why));
    };
    if (fault != nullptr) *fault = KvBlockFault::kNone;
    Reader r(bytes);
    uint8_t magic[4];
    if (!r.bytes(magic, 4) || std::memcmp(magic, kMagic, 4) != 0) return bad("no block magic");
    uint16_t version = 0;
    uint8_t codec = 0, flags = 0;
    uint32_t head = 0, layers = 0, state_bytes = 0;
    KvBlockMeta m;
    if (!r.get(version)) return bad("cut short");
    if (version != kKvBlockVersion) {
        return refuse(fault, KvBlockFault::kVersion,
                      failed_precondition("KV block: format version " + std::to_string(version) +
                                          ", this build reads " + std::to_string(kKvBlockVersion)));
    }
    if (!r.get(codec) || !r.get(flags) || !r.get(head) || !r.get(layers) || !r.get(m.fingerprint) ||
        !r.get(m.key) || !r.get(m.parent) || !r.get(m.begin) || !r.get(m.end) ||
        !r.get(m.payload_bytes) || !r.get(m.payload_crc) || !r.get(state_bytes)) {
        return bad("cut short");
    }
    if (!known_codec(codec) || flags != 0) return bad("unknown codec or flags");
    if (layers < 1 || layers > kKvBlockMaxLayers) return bad(std::to_string(layers) + " layers");
    if (m.begin < 0 || m.end <= m.begin || m.end - m.begin > kKvBlockMaxTokens)
        return bad("no token range");
    if (state_bytes > kKvBlockMaxCodecState) return bad("codec state too large");
    const size_t n = static_cast<size_t>(m.end - m.begin);
    if (head != header_size(n, layers, state_bytes)) return bad("header size");
    if (bytes.size() < head) return bad("cut short");
    // The sizes are consistent: check the header before believing any of it.
    uint32_t head_crc = 0;
    std::memcpy(&head_crc, bytes.data() + head - 4, 4);
    if (crc32c(bytes.first(head - 4)) != head_crc) {
        return refuse(fault, KvBlockFault::kChecksum, data_loss("KV block: header checksum"));
    }
    m.codec = static_cast<KvCodecId>(codec);
    m.header_bytes = head;
    m.codec_state.resize(state_bytes);
    m.tokens.resize(n);
    m.part_bytes.resize(layers);
    m.layer_error.resize(layers);
    r.bytes(m.codec_state.data(), state_bytes);
    r.bytes(m.tokens.data(), 4 * n);
    r.bytes(m.part_bytes.data(), 8 * static_cast<size_t>(layers));
    r.bytes(m.layer_error.data(), 4 * static_cast<size_t>(layers));
    uint64_t sum = 0;
    for (uint64_t b : m.part_bytes) {
        if (b > m.payload_bytes - sum) return bad("layer parts exceed the payload");
        sum += b;
    }
    if (sum != m.payload_bytes) return bad("layer parts do not fill the payload");
    if (m.fingerprint != fingerprint) {
        return refuse(
            fault, KvBlockFault::kFingerprint,
            failed_precondition("KV block: made for another model, tokenizer or profile"));
    }
    if (hash_tokens(m.parent, m.tokens) != m.key) {
        return refuse(fault, KvBlockFault::kKey,
                      data_loss("KV block: its key is not the hash of its tokens"));
    }
    return m;
}

Result<KvBlockView> parse_kv_block(std::span<const uint8_t> bytes, uint64_t fingerprint,
                                   KvBlockFault* fault) {
    DS_ASSIGN_OR_RETURN(KvBlockMeta m, parse_kv_block_header(bytes, fingerprint, fault));
    const auto payload = bytes.subspan(m.header_bytes);
    if (payload.size() != m.payload_bytes) {
        return refuse(
            fault, KvBlockFault::kFormat,
            data_loss("KV block: " + std::to_string(payload.size()) +
                      " payload bytes, the header says " + std::to_string(m.payload_bytes)));
    }
    if (crc32c(payload) != m.payload_crc) {
        return refuse(fault, KvBlockFault::kChecksum, data_loss("KV block: payload checksum"));
    }
    KvBlockView v;
    size_t at = 0;
    for (uint64_t b : m.part_bytes) {
        v.parts.push_back(payload.subspan(at, b));
        at += b;
    }
    v.meta = std::move(m);
    return v;
}

}  // namespace deltaserve::kvstore
