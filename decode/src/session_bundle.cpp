#include "deltaserve/decode/session_bundle.h"

#include <cstring>

#include "byte_fields.h"
#include "deltaserve/common/crc32c.h"
#include "deltaserve/kvstore/kv_block.h"

namespace deltaserve::decode {
namespace {

constexpr char kMagic[4] = {'D', 'S', 'B', 'N'};
constexpr uint32_t kVersion = 1;

Status bad(const std::string& what) { return data_loss("session bundle: " + what); }

}  // namespace

std::vector<uint8_t> encode_session_bundle(const SessionBundle& b) {
    std::vector<uint8_t> out(kMagic, kMagic + 4);
    put_field<uint32_t>(out, kVersion);
    put_field<uint64_t>(out, b.fingerprint);
    put_field<uint32_t>(out, static_cast<uint32_t>(b.session.size()));
    put_bytes(out, b.session.data(), b.session.size());
    put_field<uint32_t>(out, static_cast<uint32_t>(b.gateway_record.size()));
    put_bytes(out, b.gateway_record.data(), b.gateway_record.size());
    const std::string record = encode_session_record(b.record);
    put_field<uint32_t>(out, static_cast<uint32_t>(record.size()));
    put_bytes(out, record.data(), record.size());
    put_field<uint32_t>(out, static_cast<uint32_t>(b.blocks.size()));
    for (const auto& [key, bytes] : b.blocks) {
        put_field<uint64_t>(out, key);
        put_field<uint64_t>(out, bytes.size());
        put_bytes(out, bytes.data(), bytes.size());
    }
    put_field<uint32_t>(out, crc32c(out));
    return out;
}

Result<SessionBundle> decode_session_bundle(std::span<const uint8_t> bytes) {
    if (bytes.size() < 12 || std::memcmp(bytes.data(), kMagic, 4) != 0)
        return bad("not a session bundle");
    uint32_t crc = 0;
    std::memcpy(&crc, bytes.data() + bytes.size() - 4, 4);
    if (crc32c(bytes.subspan(0, bytes.size() - 4)) != crc) return bad("checksum mismatch");
    FieldReader in{bytes.subspan(4, bytes.size() - 8)};
    uint32_t version = 0, n = 0;
    SessionBundle b;
    std::span<const uint8_t> s;
    if (!in.get(version) || version != kVersion) return bad("another format version");
    if (!in.get(b.fingerprint) || !in.get(n) || n == 0 || n > 1024 || !in.take(n, s))
        return bad("no session key");
    b.session.assign(s.begin(), s.end());
    if (!in.get(n) || !in.take(n, s)) return bad("the gateway's record is cut short");
    b.gateway_record.assign(s.begin(), s.end());
    if (!in.get(n) || !in.take(n, s)) return bad("the KV record is cut short");
    auto record =
        decode_session_record(std::string_view(reinterpret_cast<const char*>(s.data()), s.size()));
    if (!record) return bad("the KV record does not parse");
    b.record = std::move(*record);
    if (!in.get(n) || n != b.record.keys.size()) return bad("not the blocks its record names");
    for (uint32_t i = 0; i < n; ++i) {
        uint64_t key = 0, size = 0;
        if (!in.get(key) || !in.get(size) || !in.take(size, s))
            return bad("block " + std::to_string(i) + " is cut short");
        kvstore::KvBlockFault fault = kvstore::KvBlockFault::kNone;
        auto v = kvstore::parse_kv_block(s, b.fingerprint, &fault);
        if (!v.ok())
            return bad("block " + std::to_string(i) + ": " + std::string(v.status().message()));
        const int32_t begin = i == 0 ? 0 : b.record.ends[i - 1];
        if (key != b.record.keys[i] || v->meta.key != key || v->meta.begin != begin ||
            v->meta.end != b.record.ends[i])
            return bad("block " + std::to_string(i) + " is not the one its record names");
        if (b.record.crcs[i] != 0 && crc32c(s) != b.record.crcs[i])
            return bad("block " + std::to_string(i) + " is not the export its record names");
        b.blocks.emplace_back(key, std::vector<uint8_t>(s.begin(), s.end()));
    }
    if (!in.s.empty()) return bad("trailing bytes");
    return b;
}

}  // namespace deltaserve::decode
