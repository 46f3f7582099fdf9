#include "deltaserve/kvstore/host_tier.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

namespace deltaserve::kvstore {
namespace {

using Clock = HostTier::Clock;
using namespace std::chrono_literals;

HostTier::Bytes block(size_t n, uint8_t fill) {
    return std::make_shared<const std::vector<uint8_t>>(n, fill);
}

HostTier::Options opts(uint64_t capacity) {
    HostTier::Options o;
    o.capacity_bytes = capacity;
    o.janitor_interval = 0ms;
    return o;
}

Clock::time_point later() { return Clock::now() + 1h; }

TEST(HostTier, GetsWhatWasPutAndCountsHitsAndMisses) {
    HostTier tier(opts(1000));
    ASSERT_TRUE(tier.put(1, block(100, 7)).ok());
    auto got = tier.get(1, "turn-1", later());
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(got->bytes().size(), 100u);
    EXPECT_EQ(got->bytes()[99], 7);
    EXPECT_EQ(tier.get(2, "turn-1", later()).status().code(), StatusCode::kNotFound);
    const auto s = tier.stats();
    EXPECT_EQ(s.hits, 1u);
    EXPECT_EQ(s.misses, 1u);
    EXPECT_EQ(s.bytes, 100u);
    EXPECT_EQ(s.blocks, 1u);
    EXPECT_EQ(s.leases, 1u);
}

// The least recently used block goes first; a read makes a block recent.
TEST(HostTier, EvictsTheLeastRecentlyUsedFirst) {
    HostTier tier(opts(300));
    for (uint64_t k : {1, 2, 3}) ASSERT_TRUE(tier.put(k, block(100, 0)).ok());
    tier.get(1, "reader", later())->release();
    ASSERT_TRUE(tier.put(4, block(100, 0)).ok());
    EXPECT_TRUE(tier.contains(1));
    EXPECT_FALSE(tier.contains(2));
    EXPECT_TRUE(tier.contains(3));
    EXPECT_TRUE(tier.contains(4));
    ASSERT_TRUE(tier.put(5, block(200, 0)).ok());  // two go: 3 then 1
    EXPECT_FALSE(tier.contains(3));
    EXPECT_FALSE(tier.contains(1));
    EXPECT_EQ(tier.stats().evictions, 3u);
    EXPECT_EQ(tier.stats().bytes, 300u);
}

// Leased and pinned blocks stay; a block that cannot fit is refused and nothing changes.
TEST(HostTier, LeasedAndPinnedBlocksAreNotEvicted) {
    HostTier tier(opts(300));
    for (uint64_t k : {1, 2, 3}) ASSERT_TRUE(tier.put(k, block(100, 0)).ok());
    auto lease = tier.get(1, "turn-7", later());
    ASSERT_TRUE(lease.ok());
    ASSERT_TRUE(tier.pin(2).ok());
    ASSERT_TRUE(tier.put(4, block(100, 0)).ok());  // only 3 can go
    EXPECT_FALSE(tier.contains(3));
    auto lease4 = tier.get(4, "transfer-2", later());
    const Status refused = tier.put(5, block(100, 0));
    EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted);
    EXPECT_TRUE(tier.contains(1) && tier.contains(2) && tier.contains(4));
    EXPECT_FALSE(tier.contains(5));
    EXPECT_EQ(tier.stats().refused, 1u);
    EXPECT_EQ(tier.put(6, block(301, 0)).code(), StatusCode::kResourceExhausted);
    // The first lease ends: its block can go.
    lease->release();
    ASSERT_TRUE(tier.put(5, block(100, 0)).ok());
    EXPECT_FALSE(tier.contains(1));
    EXPECT_TRUE(tier.contains(2) && tier.contains(4));
    // Unpinned, the pinned block is the least recent.
    lease4->release();
    ASSERT_TRUE(tier.unpin(2).ok());
    ASSERT_TRUE(tier.put(6, block(200, 0)).ok());
    EXPECT_FALSE(tier.contains(2));
    EXPECT_FALSE(tier.contains(4));
    EXPECT_TRUE(tier.contains(5) && tier.contains(6));
    EXPECT_EQ(tier.pin(99).code(), StatusCode::kNotFound);
}

// A lease past its deadline is reaped: the block can go, and the holder's view stays valid.
TEST(HostTier, ExpiredLeasesAreReapedAndViewsStayValid) {
    HostTier tier(opts(100));
    ASSERT_TRUE(tier.put(1, block(100, 9)).ok());
    auto lease = tier.get(1, "client-that-died", Clock::now() + 10ms);
    ASSERT_TRUE(lease.ok());
    EXPECT_EQ(tier.put(2, block(100, 0)).code(), StatusCode::kResourceExhausted);
    ASSERT_EQ(tier.leases().size(), 1u);
    EXPECT_EQ(tier.leases()[0].owner, "client-that-died");
    EXPECT_EQ(tier.reap_expired(Clock::now()), 0u);  // not yet
    EXPECT_EQ(tier.reap_expired(Clock::now() + 1s), 1u);
    EXPECT_FALSE(lease->active());
    EXPECT_TRUE(tier.leases().empty());
    ASSERT_TRUE(tier.put(2, block(100, 0)).ok());
    EXPECT_FALSE(tier.contains(1));
    EXPECT_EQ(lease->bytes()[0], 9);  // the evicted block's bytes, still held
    lease->release();                 // after the reaping: nothing happens
    EXPECT_EQ(tier.stats().leases_expired, 1u);
}

TEST(HostTier, TheJanitorReapsOnItsOwn) {
    HostTier::Options o = opts(100);
    o.janitor_interval = 5ms;
    HostTier tier(o);
    ASSERT_TRUE(tier.put(1, block(10, 0)).ok());
    auto lease = tier.get(1, "gone", Clock::now() + 1ms);
    for (int i = 0; i < 400 && tier.stats().leases != 0; ++i) std::this_thread::sleep_for(5ms);
    EXPECT_EQ(tier.stats().leases, 0u);
    EXPECT_FALSE(lease->active());
}

// Replacing a block keeps its leases on the key; erasing ends them; a lease may outlive the
// tier.
TEST(HostTier, ReplaceEraseAndALeaseThatOutlivesTheTier) {
    auto tier = std::make_unique<HostTier>(opts(1000));
    ASSERT_TRUE(tier->put(1, block(100, 1)).ok());
    auto lease = tier->get(1, "a", later());
    ASSERT_TRUE(tier->put(1, block(50, 2)).ok());
    EXPECT_EQ(tier->stats().bytes, 50u);
    EXPECT_EQ(lease->bytes()[0], 1);  // what it was given
    EXPECT_TRUE(lease->active());
    tier->erase(1);
    EXPECT_FALSE(lease->active());
    EXPECT_EQ(tier->stats().bytes, 0u);
    ASSERT_TRUE(tier->put(2, block(10, 3)).ok());
    auto kept = tier->get(2, "b", later());
    tier.reset();
    EXPECT_EQ(kept->bytes()[0], 3);
    kept->release();
}

// Many threads storing, reading and dropping leases: the budget holds, and when they are done
// no lease is left.
TEST(HostTier, ConcurrentUseKeepsTheBudgetAndLeavesNoLease) {
    HostTier::Options o = opts(64 * 100);
    o.janitor_interval = 1ms;
    HostTier tier(o);
    std::atomic<uint64_t> over{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
        threads.emplace_back([&, t] {
            for (int i = 0; i < 2000; ++i) {
                const uint64_t key = static_cast<uint64_t>((i * 7 + t) % 97);
                (void)tier.put(key, block(100, static_cast<uint8_t>(key)));
                auto l = tier.get(key ^ 1, "t", Clock::now() + (i % 3 == 0 ? 0ms : 1h));
                if (l.ok() && l->bytes()[0] != static_cast<uint8_t>(key ^ 1)) ++over;
                if (tier.stats().bytes > 64 * 100) ++over;
            }
        });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(over.load(), 0u);
    EXPECT_EQ(tier.stats().leases, 0u);
}

}  // namespace
}  // namespace deltaserve::kvstore
