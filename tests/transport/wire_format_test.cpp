// KV shipments on the wire: what is encoded decodes to the same header and payload; a cut,
// a flipped bit anywhere, or a shipment for another model or profile is refused with a
// clear error, never read past or accepted.
#include <gtest/gtest.h>

#include <numeric>

#include "deltaserve/transport/wire_format.h"

namespace deltaserve::transport {
namespace {

ShipmentHeader header() {
    ShipmentHeader h;
    h.codec = KvCodec::kDeltaKv;
    h.layer = 7;
    h.n_layers = 30;
    h.token_begin = 512;
    h.token_end = 1024;
    h.model_id = "llama-30x576-kv3x64";
    h.profile_id = "deltakv-ab12";
    h.session_id = "chat-42";
    return h;
}

std::vector<uint8_t> payload(size_t n) {
    std::vector<uint8_t> p(n);
    std::iota(p.begin(), p.end(), uint8_t{3});
    return p;
}

TEST(WireFormat, Crc32cIsCastagnoli) {
    const std::string s = "123456789";
    EXPECT_EQ(crc32c({reinterpret_cast<const uint8_t*>(s.data()), s.size()}), 0xE3069283u);
}

TEST(WireFormat, RoundTrip) {
    const auto p = payload(1000);
    auto bytes = encode_shipment(header(), p);
    ASSERT_TRUE(bytes.ok()) << bytes.error().message();
    auto s = decode_shipment(*bytes, "llama-30x576-kv3x64", "deltakv-ab12");
    ASSERT_TRUE(s.ok()) << s.error().message();
    EXPECT_EQ(s->header.codec, KvCodec::kDeltaKv);
    EXPECT_EQ(s->header.layer, 7);
    EXPECT_EQ(s->header.n_layers, 30);
    EXPECT_EQ(s->header.token_begin, 512);
    EXPECT_EQ(s->header.token_end, 1024);
    EXPECT_EQ(s->header.session_id, "chat-42");
    EXPECT_EQ(std::vector<uint8_t>(s->payload.begin(), s->payload.end()), p);
    // An empty payload and no expectations work too.
    bytes = encode_shipment(header(), {});
    ASSERT_TRUE(bytes.ok());
    EXPECT_TRUE(decode_shipment(*bytes, "", "").ok());
}

TEST(WireFormat, EveryCutAndEveryFlippedBitIsRefused) {
    const auto bytes = *encode_shipment(header(), payload(40));
    for (size_t n = 0; n < bytes.size(); ++n) {
        auto s = decode_shipment(std::span<const uint8_t>(bytes).first(n), "", "");
        ASSERT_FALSE(s.ok()) << "cut at " << n;
    }
    int by_checksum = 0;
    for (size_t i = 0; i < bytes.size(); ++i) {
        for (int bit = 0; bit < 8; ++bit) {
            auto bad = bytes;
            bad[i] ^= static_cast<uint8_t>(1 << bit);
            auto s = decode_shipment(bad, "", "");
            ASSERT_FALSE(s.ok()) << "byte " << i << " bit " << bit;
            by_checksum += s.error().message().find("checksum") != std::string::npos;
        }
    }
    EXPECT_GT(by_checksum, static_cast<int>(bytes.size()) * 4)
        << "most flips are caught by the CRC";
    auto longer = bytes;
    longer.push_back(0);
    EXPECT_EQ(decode_shipment(longer, "", "").status().code(), StatusCode::kDataLoss);
}

TEST(WireFormat, ShipmentsForAnotherModelOrProfileAreRefused) {
    const auto bytes = *encode_shipment(header(), payload(8));
    auto s = decode_shipment(bytes, "other-model", "");
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.error().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(s.error().message().find("'llama-30x576-kv3x64'"), std::string::npos)
        << s.error().message();
    s = decode_shipment(bytes, "llama-30x576-kv3x64", "deltakv-ffff");
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.error().message().find("compression profile 'deltakv-ab12'"), std::string::npos);
    std::vector<uint8_t> not_kv(64, 'x');
    EXPECT_NE(decode_shipment(not_kv, "", "").error().message().find("bad magic"),
              std::string::npos);
}

TEST(WireFormat, InvalidHeadersAreNotEncoded) {
    ShipmentHeader h = header();
    h.layer = 30;
    EXPECT_EQ(encode_shipment(h, {}).status().code(), StatusCode::kInvalidArgument);
    h = header();
    h.token_end = 10;
    EXPECT_EQ(encode_shipment(h, {}).status().code(), StatusCode::kInvalidArgument);
    h = header();
    h.session_id.assign(kMaxIdBytes + 1, 's');
    EXPECT_EQ(encode_shipment(h, {}).status().code(), StatusCode::kInvalidArgument);
    h = header();
    h.codec = static_cast<KvCodec>(9);
    EXPECT_EQ(encode_shipment(h, {}).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace deltaserve::transport
