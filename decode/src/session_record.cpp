#include "deltaserve/decode/session_record.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "byte_fields.h"
#include "deltaserve/common/chain_hash.h"

namespace deltaserve::decode {
namespace {

constexpr char kMagic[4] = {'D', 'S', 'S', 'R'};
constexpr uint32_t kVersion = 2;
constexpr uint32_t kMaxTokens = 1u << 24;

}  // namespace

std::string encode_session_record(const SessionRecord& r) {
    std::string s(kMagic, 4);
    put_field<uint32_t>(s, kVersion);
    put_field<uint32_t>(s, static_cast<uint32_t>(r.keys.size()));
    for (size_t i = 0; i < r.keys.size(); ++i) {
        put_field<uint64_t>(s, r.keys[i]);
        put_field<int32_t>(s, r.ends[i]);
        put_field<uint32_t>(s, r.crcs[i]);
    }
    put_field<uint32_t>(s, static_cast<uint32_t>(r.tokens.size()));
    for (int32_t t : r.tokens) put_field<int32_t>(s, t);
    put_field<uint32_t>(s, static_cast<uint32_t>(r.hints.size()));
    put_bytes(s, r.hints.data(), r.hints.size());
    put_field<uint32_t>(s, static_cast<uint32_t>(r.turn_ends.size()));
    for (int32_t e : r.turn_ends) put_field<int32_t>(s, e);
    return s;
}

std::optional<SessionRecord> decode_session_record(std::string_view bytes) {
    FieldReader in{{reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}};
    char magic[4];
    uint32_t version = 0, n = 0;
    if (!in.get(magic) || std::memcmp(magic, kMagic, 4) != 0) return std::nullopt;
    if (!in.get(version) || (version != 1 && version != kVersion) || !in.get(n))
        return std::nullopt;
    if (n == 0 || n > in.s.size() / 16) return std::nullopt;
    SessionRecord r;
    int32_t last = 0;
    for (uint32_t i = 0; i < n; ++i) {
        uint64_t key = 0;
        int32_t end = 0;
        uint32_t crc = 0;
        if (!in.get(key) || !in.get(end) || !in.get(crc) || end <= last) return std::nullopt;
        r.keys.push_back(key);
        r.ends.push_back(end);
        r.crcs.push_back(crc);
        last = end;
    }
    uint32_t n_tokens = 0, n_hints = 0;
    if (!in.get(n_tokens) || n_tokens > kMaxTokens || n_tokens > in.s.size() / 4 ||
        static_cast<int32_t>(n_tokens) != last) {
        return std::nullopt;
    }
    r.tokens.resize(n_tokens);
    for (int32_t& t : r.tokens) in.get(t);
    std::span<const uint8_t> hints;
    if (!in.get(n_hints) || !in.take(n_hints, hints)) return std::nullopt;
    r.hints.assign(hints.begin(), hints.end());
    if (version == 1)
        return in.s.empty() ? std::optional<SessionRecord>(std::move(r)) : std::nullopt;
    uint32_t n_turns = 0;
    if (!in.get(n_turns) || n_turns != in.s.size() / 4 || in.s.size() % 4 != 0) return std::nullopt;
    int32_t prev = 0;
    for (uint32_t i = 0; i < n_turns; ++i) {
        int32_t e = 0;
        in.get(e);
        if (e <= prev || e > last) return std::nullopt;
        r.turn_ends.push_back(prev = e);
    }
    return r;
}

std::string session_record_key(uint64_t fingerprint, const std::string& session) {
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(fingerprint));
    return "ds/" + std::string(hex) + "/" + session;
}

bool parse_session_record_key(std::string_view k, uint64_t* fingerprint, std::string* session) {
    if (k.size() < 3 + 16 + 2 || k.substr(0, 3) != "ds/" || k[19] != '/') return false;
    uint64_t fp = 0;
    for (char c : k.substr(3, 16)) {
        const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return false;
        fp = fp << 4 | static_cast<uint64_t>(d);
    }
    *fingerprint = fp;
    *session = std::string(k.substr(20));
    return true;
}

uint64_t prefix_root(uint64_t fingerprint, const std::string& scope) {
    // Shared blocks are shared within a cache scope (a tenant) only, as the prefix cache's.
    return hash_string(fingerprint, "prefix:" + scope);
}

std::vector<uint64_t> prefix_chain(uint64_t fingerprint, const std::string& scope,
                                   std::span<const int32_t> tokens, int32_t block_tokens) {
    std::vector<uint64_t> keys;
    uint64_t key = prefix_root(fingerprint, scope);
    const size_t b = static_cast<size_t>(std::max(1, block_tokens));
    for (size_t end = b; end < tokens.size(); end += b) {
        key = hash_tokens(key, tokens.subspan(end - b, b));
        keys.push_back(key);
    }
    return keys;
}

}  // namespace deltaserve::decode
