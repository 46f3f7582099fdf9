// The device tier in a backend's memory: on this machine, a backend whose memory is its own
// (own_memory_backend.h), where a GPU's tier is the same code on the CUDA backend.
#include "deltaserve/kvstore/device_tier.h"

#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "deltaserve/kernels/backend.h"
#include "own_memory_backend.h"

namespace deltaserve::kvstore {
namespace {

std::vector<uint8_t> block(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<uint8_t> b(n);
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    return b;
}

class DeviceTierTest : public ::testing::Test {
  protected:
    std::unique_ptr<DeviceTier> make(uint64_t capacity) {
        auto tier = make_device_tier(device_, capacity);
        EXPECT_TRUE(tier.ok()) << tier.status().to_string();
        return tier.ok() ? std::move(*tier) : nullptr;
    }
    testing::OwnMemoryBackend device_;
};

TEST_F(DeviceTierTest, HostMemoryAndAZeroBudgetAreRefused) {
    auto on_cpu = make_device_tier(*kernels::find_backend("cpu"), 1000);
    ASSERT_FALSE(on_cpu.ok());
    EXPECT_EQ(on_cpu.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(make_device_tier(device_, 0).status().code(), StatusCode::kInvalidArgument);
    auto tier = make(1000);
    ASSERT_NE(tier, nullptr);
    EXPECT_EQ(tier->device(), "own-memory");
}

TEST_F(DeviceTierTest, BlocksComeBackExactlyAndTheLeastRecentlyUsedGoesFirst) {
    auto tier = make(3000);
    ASSERT_NE(tier, nullptr);
    for (uint64_t key = 1; key <= 3; ++key)
        ASSERT_TRUE(tier->put(key, block(1000, static_cast<uint32_t>(key))).ok());
    auto one = tier->get(1);  // 1 is now more recent than 2
    ASSERT_TRUE(one.ok());
    EXPECT_EQ(*one, block(1000, 1));
    ASSERT_TRUE(tier->put(4, block(1000, 4)).ok());
    EXPECT_FALSE(tier->contains(2));
    EXPECT_TRUE(tier->contains(1) && tier->contains(3) && tier->contains(4));
    EXPECT_EQ(tier->size_of(4), 1000u);
    EXPECT_EQ(tier->size_of(2), std::nullopt);
    EXPECT_EQ(tier->get(2).status().code(), StatusCode::kNotFound);
    EXPECT_EQ(*tier->get(3), block(1000, 3));
    EXPECT_EQ(*tier->peek(1), block(1000, 1));  // a look: no hit, 1 stays the oldest
    EXPECT_EQ(tier->peek(2).status().code(), StatusCode::kNotFound);
    const DeviceTier::Stats s = tier->stats();
    EXPECT_EQ(s.capacity, 3000u);
    EXPECT_EQ(s.bytes, 3000u);
    EXPECT_EQ(s.blocks, 3u);
    EXPECT_EQ(s.stores, 4u);
    EXPECT_EQ(s.evictions, 1u);
    EXPECT_EQ(s.hits, 2u);
    EXPECT_EQ(s.misses, 1u);
    ASSERT_TRUE(tier->put(5, block(1000, 5)).ok());  // the oldest, 1, goes
    EXPECT_FALSE(tier->contains(1));
}

TEST_F(DeviceTierTest, AReplacedKeyAndABlockLargerThanTheBudget) {
    auto tier = make(2500);
    ASSERT_NE(tier, nullptr);
    ASSERT_TRUE(tier->put(1, block(1000, 1)).ok());
    ASSERT_TRUE(tier->put(2, block(1000, 2)).ok());
    ASSERT_TRUE(tier->put(1, block(1500, 11)).ok());  // replaces 1; both fit
    EXPECT_EQ(tier->stats().bytes, 2500u);
    EXPECT_EQ(tier->stats().evictions, 0u);
    EXPECT_EQ(*tier->get(1), block(1500, 11));
    const Status too_big = tier->put(3, block(2501, 3));
    EXPECT_EQ(too_big.code(), StatusCode::kResourceExhausted);
    EXPECT_EQ(tier->stats().refused, 1u);
    EXPECT_TRUE(tier->contains(1) && tier->contains(2));
    EXPECT_EQ(*tier->get(2), block(1000, 2));
    tier->erase(1);
    EXPECT_EQ(tier->stats().bytes, 1000u);
    ASSERT_TRUE(tier->put(5, {}).ok());  // an empty block is a block
    EXPECT_TRUE(tier->get(5)->empty());
}

TEST_F(DeviceTierTest, ADeviceFailureChangesNothing) {
    auto tier = make(2000);
    ASSERT_NE(tier, nullptr);
    ASSERT_TRUE(tier->put(1, block(1000, 1)).ok());
    ASSERT_TRUE(tier->put(2, block(1000, 2)).ok());
    device_.fail_after(0);  // the copy in fails: 1 stays, nothing is evicted
    const Status failed = tier->put(3, block(1000, 3));
    device_.fail_after(-1);
    EXPECT_FALSE(failed.ok());
    EXPECT_NE(failed.message().find("injected failure"), std::string::npos) << failed.message();
    EXPECT_FALSE(tier->contains(3));
    EXPECT_TRUE(tier->contains(1) && tier->contains(2));
    device_.fail_after(0);  // the copy out fails: an error, the block stays
    EXPECT_FALSE(tier->get(1).ok());
    device_.fail_after(-1);
    EXPECT_EQ(*tier->get(1), block(1000, 1));
    EXPECT_EQ(tier->stats().bytes, 2000u);
}

TEST_F(DeviceTierTest, ThreadsPuttingGettingAndErasingKeepTheBudget) {
    auto tier = make(20 * 1000);
    ASSERT_NE(tier, nullptr);
    std::atomic<int> wrong{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
        threads.emplace_back([&, t] {
            std::mt19937 rng(static_cast<uint32_t>(t));
            for (int i = 0; i < 300; ++i) {
                const uint64_t key = rng() % 40;
                // A key's block is always the same bytes: whatever a get returns must be them.
                const std::vector<uint8_t> b = block(500 + key * 20, static_cast<uint32_t>(key));
                switch (rng() % 3) {
                    case 0:
                        if (!tier->put(key, b).ok()) ++wrong;
                        break;
                    case 1:
                        if (auto got = tier->get(key); got.ok() && *got != b) ++wrong;
                        break;
                    default:
                        tier->erase(key);
                }
            }
        });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(wrong.load(), 0);
    const DeviceTier::Stats s = tier->stats();
    EXPECT_LE(s.bytes, s.capacity);
    uint64_t held = 0, blocks = 0;
    for (uint64_t key = 0; key < 40; ++key) {
        if (auto size = tier->size_of(key)) {
            held += *size;
            ++blocks;
        }
    }
    EXPECT_EQ(held, s.bytes);
    EXPECT_EQ(blocks, s.blocks);
}

// The same tier in a GPU's memory (tests/gpu/device_check.sh runs it on a lent one); skips
// without the CUDA backend or a device.
TEST(DeviceTierOnCuda, BlocksComeBackExactlyAndTheLeastRecentlyUsedGoesFirst) {
    kernels::Backend* cuda = kernels::find_backend("cuda");
    if (cuda == nullptr) GTEST_SKIP() << "CUDA backend not built";
    if (!cuda->available()) {
        EXPECT_EQ(make_device_tier(*cuda, 1 << 20).status().code(), StatusCode::kUnavailable);
        GTEST_SKIP() << "no CUDA device";
    }
    auto tier = make_device_tier(*cuda, 5 << 20);
    ASSERT_TRUE(tier.ok()) << tier.status().to_string();
    for (uint64_t key = 1; key <= 2; ++key)
        ASSERT_TRUE((*tier)->put(key, block(2 << 20, static_cast<uint32_t>(key))).ok());
    EXPECT_EQ(*(*tier)->get(1), block(2 << 20, 1));
    ASSERT_TRUE((*tier)->put(3, block(2 << 20, 3)).ok());  // 2 goes
    EXPECT_FALSE((*tier)->contains(2));
    EXPECT_EQ(*(*tier)->get(3), block(2 << 20, 3));
    EXPECT_EQ(*(*tier)->get(1), block(2 << 20, 1));
    EXPECT_EQ((*tier)->stats().bytes, uint64_t{4} << 20);
    EXPECT_NE((*tier)->device().find("cuda"), std::string::npos);
}

}  // namespace
}  // namespace deltaserve::kvstore
