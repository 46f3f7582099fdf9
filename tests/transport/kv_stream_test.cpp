// The KV stream's message headers: what one node writes the other reads back, and anything
// else is refused with a clear error.
#include <gtest/gtest.h>

#include "deltaserve/transport/kv_stream.h"

namespace deltaserve::transport {
namespace {

TEST(KvStream, HeadersRoundTrip) {
    StreamHeader h;
    h.kind = StreamKind::kEnd;
    h.turn = 0x1234567890ULL;
    h.n_tokens = 4096;
    h.token = 17;
    h.session = "chat-42";
    h.message = "why";
    auto bytes = encode_stream_header(h);
    ASSERT_TRUE(bytes.ok());
    auto back = decode_stream_header(*bytes);
    ASSERT_TRUE(back.ok()) << back.error().to_string();
    EXPECT_EQ(back->kind, StreamKind::kEnd);
    EXPECT_EQ(back->turn, h.turn);
    EXPECT_EQ(back->n_tokens, 4096);
    EXPECT_EQ(back->token, 17);
    EXPECT_EQ(back->session, "chat-42");
    EXPECT_EQ(back->message, "why");
}

TEST(KvStream, MalformedHeadersAreRefused) {
    StreamHeader h;
    h.session = "s";
    auto bytes = encode_stream_header(h);
    ASSERT_TRUE(bytes.ok());
    for (size_t cut = 0; cut < bytes->size(); ++cut) {
        auto r = decode_stream_header(std::span<const std::byte>(bytes->data(), cut));
        EXPECT_FALSE(r.ok()) << "cut at " << cut;
    }
    auto bad_kind = *bytes;
    bad_kind[5] = std::byte{9};
    EXPECT_EQ(decode_stream_header(bad_kind).status().code(), StatusCode::kInvalidArgument);
    auto bad_version = *bytes;
    bad_version[4] = std::byte{1};  // before the handshake
    EXPECT_EQ(decode_stream_header(bad_version).status().code(), StatusCode::kInvalidArgument);
    auto trailing = *bytes;
    trailing.push_back(std::byte{0});
    EXPECT_EQ(decode_stream_header(trailing).status().code(), StatusCode::kDataLoss);
    h.session.assign(2000, 'x');
    EXPECT_EQ(encode_stream_header(h).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace deltaserve::transport
