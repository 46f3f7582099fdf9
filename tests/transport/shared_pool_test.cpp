// The same-host payload path's pieces (transport/src/shared_pool.h): the pool offer a
// process makes in its hello, mapping a peer's pool only when it is what the offer says, and
// the reference and ack that travel instead of the payload.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "../../transport/src/shared_pool.h"
#include "deltaserve/transport/buffer.h"

namespace deltaserve::transport {
namespace {

TEST(SharedPool, OffersRoundTripAndGarbageIsRefused) {
    const PoolOffer offer{1234, 7, 64 << 20, random_pool_name()};
    auto parsed = parse_offer("hello " + encode_offer(offer));
    ASSERT_TRUE(parsed.has_value());
    EXPECT_EQ(parsed->pid, 1234);
    EXPECT_EQ(parsed->fd, 7);
    EXPECT_EQ(parsed->size, size_t{64} << 20);
    EXPECT_EQ(parsed->name, offer.name);
    EXPECT_NE(random_pool_name(), random_pool_name());

    for (const char* bad : {"hello", "shm", "shm 1 2", "shm x 2 3 deltaserve-pool-1",
                            "shm 0 2 3 deltaserve-pool-1", "shm 1 2 0 deltaserve-pool-1",
                            "shm 1 2 3 /etc/passwd", "shm -5 2 3 deltaserve-pool-1"}) {
        EXPECT_FALSE(parse_offer(bad).has_value()) << bad;
    }
}

TEST(SharedPool, APoolOfThisHostMapsAndReadsBack) {
    const std::string name = random_pool_name();
    auto pool = BufferPool::create(1 << 20, nullptr, nullptr, name);
    ASSERT_TRUE(pool.ok()) << pool.error().to_string();
    ASSERT_GE((*pool)->share_fd(), 0) << "memfd_create is available on Linux";
    Buffer b = (*pool)->try_acquire(4096);
    ASSERT_NE(b.data(), nullptr);
    for (size_t i = 0; i < b.size(); ++i) b.data()[i] = static_cast<std::byte>(i * 7);

    auto peer = PeerPool::map({getpid(), (*pool)->share_fd(), (*pool)->capacity(), name});
    ASSERT_TRUE(peer.ok()) << peer.error().to_string();
    const std::byte* seen = (*peer)->at((*pool)->offset_of(b.data()), b.size());
    ASSERT_NE(seen, nullptr);
    EXPECT_EQ(std::memcmp(seen, b.data(), b.size()), 0);
    // Writes after mapping are seen too: it is the same memory.
    b.data()[0] = std::byte{0x5a};
    EXPECT_EQ(seen[0], std::byte{0x5a});

    // Places outside the pool are refused, including ones that wrap around.
    const size_t size = (*pool)->capacity();
    EXPECT_NE((*peer)->at(size - 1, 1), nullptr);
    EXPECT_EQ((*peer)->at(size - 1, 2), nullptr);
    EXPECT_EQ((*peer)->at(size + 1, 0), nullptr);
    EXPECT_EQ((*peer)->at(8, ~uint64_t{0}), nullptr);
}

TEST(SharedPool, OnlyTheOfferedSealedFileIsMapped) {
    const std::string name = random_pool_name();
    auto pool = BufferPool::create(1 << 20, nullptr, nullptr, name);
    ASSERT_TRUE(pool.ok());
    const int fd = (*pool)->share_fd();
    const size_t size = (*pool)->capacity();

    // Another name under that descriptor (a reused pid, another pid namespace).
    auto other = PeerPool::map({getpid(), fd, size, random_pool_name()});
    EXPECT_EQ(other.error().code(), StatusCode::kUnavailable);
    EXPECT_NE(other.error().message().find("another file"), std::string::npos)
        << other.error().message();
    // A larger size than the file has.
    EXPECT_FALSE(PeerPool::map({getpid(), fd, size * 2, name}).ok());
    // A descriptor that is not open, a process that does not exist.
    EXPECT_FALSE(PeerPool::map({getpid(), 1 << 20, size, name}).ok());
    EXPECT_FALSE(PeerPool::map({1 << 30, fd, size, name}).ok());

    // A file of the right name whose size its owner could still shrink.
    const std::string unsealed_name = random_pool_name();
    const int unsealed = memfd_create(unsealed_name.c_str(), MFD_CLOEXEC);
    ASSERT_GE(unsealed, 0);
    ASSERT_EQ(ftruncate(unsealed, 1 << 20), 0);
    auto refused = PeerPool::map({getpid(), unsealed, 1 << 20, unsealed_name});
    EXPECT_FALSE(refused.ok());
    EXPECT_NE(refused.error().message().find("not sealed"), std::string::npos)
        << refused.error().message();
    close(unsealed);
}

TEST(SharedPool, ReferencesAndAcksRoundTrip) {
    std::vector<std::byte> header = {std::byte{1}, std::byte{2}, std::byte{3}};
    append_ref(header, PoolRef{4096, 1 << 20, 17});
    ASSERT_EQ(header.size(), 3 + kPoolRefBytes);
    size_t app = 0;
    auto ref = take_ref(header.data(), header.size(), &app);
    ASSERT_TRUE(ref.has_value());
    EXPECT_EQ(app, 3u);
    EXPECT_EQ(ref->offset, 4096u);
    EXPECT_EQ(ref->length, size_t{1} << 20);
    EXPECT_EQ(ref->seq, 17u);
    EXPECT_FALSE(take_ref(header.data(), kPoolRefBytes - 1, &app).has_value());

    const std::string ack = encode_ack(123456789);
    EXPECT_EQ(parse_ack(ack.data(), ack.size()), std::optional<uint64_t>(123456789));
    EXPECT_FALSE(parse_ack(ack.data(), 7).has_value());
}

}  // namespace
}  // namespace deltaserve::transport
