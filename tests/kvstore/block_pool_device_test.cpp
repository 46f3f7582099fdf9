// Full KV's block pool in a device backend's memory, on a backend whose memory is its own
// (own_memory_backend.h: pointers outside it are refused, as a GPU faults on them): the same
// rows as a host pool through the pool's row ops, and a device failure holds nothing.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "deltaserve/kvstore/block_pool.h"
#include "deltaserve/kvstore/kv_cache.h"
#include "own_memory_backend.h"

namespace deltaserve::kvstore {
namespace {

namespace k = deltaserve::kernels;

constexpr int32_t kB = BlockPool::kBlockTokens;
constexpr int32_t kLayers = 2, kDim = 16;

class BlockPoolOnADevice : public ::testing::Test {
  protected:
    std::shared_ptr<BlockPool> pool(k::Backend* backend, int32_t blocks) {
        BlockPoolOptions o{kLayers, kDim, 2, k::DType::kF16, blocks};
        o.backend = backend;
        auto p = BlockPool::create(o);
        EXPECT_TRUE(p.ok()) << p.status().to_string();
        return p.ok() ? *p : nullptr;
    }
    // n tokens of random K and V rows (the same for a seed) stored in every layer: from host
    // memory into a host pool, from the device's memory into a device pool.
    Status append(FullSequenceCache& c, int32_t n, uint32_t seed) {
        DS_RETURN_IF_ERROR(c.reserve(n));
        std::mt19937 rng(seed);
        std::normal_distribution<float> dist;
        std::vector<float> rows(static_cast<size_t>(2 * n * kDim));
        for (float& x : rows) x = dist(rng);
        const float* at = rows.data();
        k::Buffer on_device;
        if (c.device() != nullptr) {
            DS_ASSIGN_OR_RETURN(on_device, c.device()->alloc(rows.size() * sizeof(float)));
            DS_RETURN_IF_ERROR(c.device()->copy_in(on_device.data(), rows.data(),
                                                   rows.size() * sizeof(float), k::Exec{}));
            at = on_device.f32();
        }
        for (int32_t l = 0; l < kLayers; ++l) {
            if (Status st = c.store(l, 0, n, at, at + n * kDim, kDim); !st.ok()) {
                c.truncate(c.n_tokens());
                return st;
            }
        }
        return c.commit(n);
    }
    testing::OwnMemoryBackend device_;
};

TEST_F(BlockPoolOnADevice, ItsRowsAreAHostPoolsBytes) {
    auto host = pool(nullptr, 8), dev = pool(&device_, 8);
    ASSERT_TRUE(host && dev);
    EXPECT_EQ(host->device(), nullptr);
    EXPECT_EQ(dev->device(), &device_);
    EXPECT_EQ(pool(k::find_backend("cpu"), 1)->device(), nullptr);  // host memory: no device
    FullSequenceCache h(host), d(dev);
    ASSERT_TRUE(append(h, kB + 9, 1).ok());
    ASSERT_TRUE(append(d, kB + 9, 1).ok());
    EXPECT_EQ(d.device(), &device_);
    for (int32_t l = 0; l < kLayers; ++l) {
        EXPECT_EQ(*d.export_layer(l), *h.export_layer(l)) << "layer " << l;
        EXPECT_EQ(*d.export_rows(l, 3, kB + 2), *h.export_rows(l, 3, kB + 2)) << "layer " << l;
    }
    // Into another device cache and out again: the same bytes.
    FullSequenceCache back(dev);
    ASSERT_TRUE(back.import_state(*h.export_state()).ok());
    for (int32_t l = 0; l < kLayers; ++l)
        ASSERT_TRUE(back.import_layer(l, *h.export_layer(l)).ok());
    for (int32_t l = 0; l < kLayers; ++l) EXPECT_EQ(*back.export_layer(l), *h.export_layer(l));
    // A shared block written into after a truncate is copied on the device: the sharer's rows
    // stay, the writer's first rows are the copy's.
    FullSequenceCache hs(host), ds(dev);
    ASSERT_TRUE(hs.adopt_blocks(h.blocks(1)).ok());
    ASSERT_TRUE(ds.adopt_blocks(d.blocks(1)).ok());
    hs.truncate(5);
    ds.truncate(5);
    ASSERT_TRUE(append(hs, 4, 2).ok());
    ASSERT_TRUE(append(ds, 4, 2).ok());
    for (int32_t l = 0; l < kLayers; ++l) {
        EXPECT_EQ(*ds.export_layer(l), *hs.export_layer(l));
        EXPECT_EQ(*d.export_layer(l), *h.export_layer(l));
    }
}

TEST_F(BlockPoolOnADevice, ADeviceFailureHoldsNothing) {
    auto dev = pool(&device_, 8);
    ASSERT_TRUE(dev);
    FullSequenceCache a(dev);
    ASSERT_TRUE(append(a, kB + 4, 3).ok());
    const int32_t free = dev->free_blocks();

    // A store that fails: an error, and the reserve is given back.
    device_.fail_after(1);  // the rows go in, the store fails
    EXPECT_FALSE(append(a, 3, 4).ok());
    device_.fail_after(-1);
    EXPECT_EQ(a.n_tokens(), kB + 4);
    EXPECT_EQ(dev->free_blocks(), free);

    // An import whose zeroing fails: nothing taken.
    FullSequenceCache b(dev);
    device_.fail_after(0);
    EXPECT_FALSE(b.import_state(*a.export_state()).ok());
    device_.fail_after(-1);
    EXPECT_EQ(b.n_tokens(), 0);
    EXPECT_EQ(dev->free_blocks(), free);

    // The copy of a shared block fails: the fresh block goes back, and the next reserve
    // copies it.
    FullSequenceCache c(dev);
    ASSERT_TRUE(c.adopt_blocks(a.blocks(1)).ok());
    c.truncate(7);
    device_.fail_after(0);
    EXPECT_FALSE(c.reserve(1).ok());
    device_.fail_after(-1);
    EXPECT_EQ(dev->free_blocks(), free);
    ASSERT_TRUE(append(c, 2, 5).ok());
    EXPECT_EQ(dev->free_blocks(), free - 1);
    EXPECT_EQ(*c.export_rows(0, 0, 7), *a.export_rows(0, 0, 7));  // the copy's rows
}

}  // namespace
}  // namespace deltaserve::kvstore
