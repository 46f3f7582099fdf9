#include "deltaserve/kvstore/kv_block.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "deltaserve/common/chain_hash.h"
#include "deltaserve/common/crc32c.h"

namespace deltaserve::kvstore {
namespace {

constexpr uint64_t kFingerprint = 0x1234abcd5678ef01ull;

struct Sample {
    KvBlockMeta meta;
    std::vector<std::vector<uint8_t>> parts;
    std::vector<uint8_t> bytes;
};

// A DeltaKV-coded block of tokens [16, 48) over 3 layers with parts of different sizes.
Sample sample() {
    Sample s;
    s.meta.codec = KvCodecId::kDeltaKv;
    s.meta.fingerprint = kFingerprint;
    s.meta.parent = hash_tokens(kFingerprint, std::vector<int32_t>(16, 7));
    s.meta.begin = 16;
    s.meta.end = 48;
    for (int32_t i = 0; i < 32; ++i) s.meta.tokens.push_back(1000 + i);
    s.meta.codec_state = {1, 2, 3, 4, 5};
    s.meta.layer_error = {std::numeric_limits<float>::quiet_NaN(), 0.031f, 0.044f};
    for (size_t l = 0; l < 3; ++l) {
        std::vector<uint8_t> p(100 + 37 * l);
        for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<uint8_t>(i * 13 + l);
        s.parts.push_back(std::move(p));
    }
    std::vector<std::span<const uint8_t>> views(s.parts.begin(), s.parts.end());
    auto bytes = encode_kv_block(s.meta, views);
    EXPECT_TRUE(bytes.ok()) << bytes.status().to_string();
    s.bytes = *bytes;
    return s;
}

TEST(KvBlock, RoundTripsWhatItDescribes) {
    const Sample s = sample();
    KvBlockFault fault = KvBlockFault::kChecksum;
    auto v = parse_kv_block(s.bytes, kFingerprint, &fault);
    ASSERT_TRUE(v.ok()) << v.status().to_string();
    EXPECT_EQ(fault, KvBlockFault::kNone);
    const KvBlockMeta& m = v->meta;
    EXPECT_EQ(m.codec, KvCodecId::kDeltaKv);
    EXPECT_EQ(m.begin, 16);
    EXPECT_EQ(m.end, 48);
    EXPECT_EQ(m.tokens, s.meta.tokens);
    EXPECT_EQ(m.parent, s.meta.parent);
    EXPECT_EQ(m.key, hash_tokens(s.meta.parent, s.meta.tokens));
    EXPECT_EQ(m.codec_state, s.meta.codec_state);
    ASSERT_EQ(m.n_layers(), 3);
    EXPECT_TRUE(std::isnan(m.layer_error[0]));
    EXPECT_EQ(m.layer_error[2], 0.044f);
    ASSERT_EQ(v->parts.size(), 3u);
    for (size_t l = 0; l < 3; ++l) {
        EXPECT_TRUE(std::equal(v->parts[l].begin(), v->parts[l].end(), s.parts[l].begin(),
                               s.parts[l].end()))
            << "layer " << l;
    }
    // The header alone, from the block's first bytes.
    auto head = parse_kv_block_header(std::span(s.bytes).first(m.header_bytes), kFingerprint);
    ASSERT_TRUE(head.ok()) << head.status().to_string();
    EXPECT_EQ(head->payload_bytes, s.bytes.size() - m.header_bytes);
}

KvBlockFault fault_of(std::span<const uint8_t> bytes, uint64_t fingerprint, StatusCode* code) {
    KvBlockFault fault = KvBlockFault::kNone;
    auto v = parse_kv_block(bytes, fingerprint, &fault);
    *code = v.ok() ? StatusCode::kOk : v.status().code();
    return fault;
}

// A flipped bit anywhere is refused; where it lands decides the reason.
TEST(KvBlock, EveryFlippedBitIsRefused) {
    const Sample s = sample();
    const uint32_t head = *reinterpret_cast<const uint32_t*>(s.bytes.data() + 8);
    for (size_t at = 0; at < s.bytes.size(); ++at) {
        std::vector<uint8_t> b = s.bytes;
        b[at] ^= static_cast<uint8_t>(1u << (at % 8));
        StatusCode code;
        const KvBlockFault f = fault_of(b, kFingerprint, &code);
        ASSERT_NE(code, StatusCode::kOk) << "byte " << at;
        if (at >= head) {
            EXPECT_EQ(f, KvBlockFault::kChecksum) << "payload byte " << at;
        } else if (at >= 4 && at < 6) {
            EXPECT_EQ(f, KvBlockFault::kVersion) << "version byte " << at;
        } else {
            EXPECT_TRUE(f == KvBlockFault::kFormat || f == KvBlockFault::kChecksum)
                << "header byte " << at << ": " << kv_block_fault_name(f);
        }
    }
}

TEST(KvBlock, RefusesCutsAndTrailingBytes) {
    const Sample s = sample();
    StatusCode code;
    for (size_t n : {size_t{0}, size_t{3}, size_t{40}, size_t{63}, s.bytes.size() - 1}) {
        EXPECT_EQ(fault_of(std::span(s.bytes).first(n), kFingerprint, &code), KvBlockFault::kFormat)
            << n;
        EXPECT_EQ(code, StatusCode::kDataLoss);
    }
    std::vector<uint8_t> longer = s.bytes;
    longer.push_back(0);
    EXPECT_EQ(fault_of(longer, kFingerprint, &code), KvBlockFault::kFormat);
}

// A block made for another model or profile never matches, even intact.
TEST(KvBlock, RefusesAnotherFingerprint) {
    const Sample s = sample();
    StatusCode code;
    EXPECT_EQ(fault_of(s.bytes, kFingerprint + 1, &code), KvBlockFault::kFingerprint);
    EXPECT_EQ(code, StatusCode::kFailedPrecondition);
}

// A header rewritten with a valid checksum but a key that is not its tokens' hash (a block
// filed under another prefix) is refused.
TEST(KvBlock, RefusesAKeyThatIsNotItsTokensHash) {
    Sample s = sample();
    const uint32_t head = *reinterpret_cast<const uint32_t*>(s.bytes.data() + 8);
    s.bytes[24] ^= 1;  // the key
    const uint32_t crc = crc32c(std::span(s.bytes).first(head - 4));
    std::memcpy(s.bytes.data() + head - 4, &crc, 4);
    StatusCode code;
    EXPECT_EQ(fault_of(s.bytes, kFingerprint, &code), KvBlockFault::kKey);
    EXPECT_EQ(code, StatusCode::kDataLoss);
}

TEST(KvBlock, EncodeRefusesWhatItCannotDescribe) {
    Sample s = sample();
    std::vector<std::span<const uint8_t>> views(s.parts.begin(), s.parts.end());
    KvBlockMeta m = s.meta;
    m.end = m.begin + 31;  // 32 ids
    EXPECT_EQ(encode_kv_block(m, views).status().code(), StatusCode::kInvalidArgument);
    m = s.meta;
    m.layer_error.pop_back();  // 2 layers, 3 parts
    EXPECT_EQ(encode_kv_block(m, views).status().code(), StatusCode::kInvalidArgument);
    m = s.meta;
    m.codec = KvCodecId::kNone;
    EXPECT_EQ(encode_kv_block(m, views).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace deltaserve::kvstore
