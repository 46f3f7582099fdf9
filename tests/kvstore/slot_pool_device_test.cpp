// DeltaKV's slot pool in a device backend's memory, on a backend whose memory is its own
// (own_memory_backend.h: pointers outside it are refused, as a GPU faults on them): the same
// rows as a host pool through the pool's row ops while its arena grows and shrinks, and a
// device failure takes nothing.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "deltaserve/kvstore/slot_pool.h"
#include "own_memory_backend.h"

namespace deltaserve::kvstore {
namespace {

namespace k = deltaserve::kernels;

constexpr int32_t kLayers = 3, kDim = 16, kSlots = 2000;

class SlotPoolOnADevice : public ::testing::Test {
  protected:
    std::unique_ptr<SlotPool> pool(k::Backend* backend) {
        SlotPoolOptions o{kLayers, kDim, kSlots, k::DType::kF16, 2};
        o.backend = backend;
        auto p = SlotPool::create(o);
        EXPECT_TRUE(p.ok()) << p.status().to_string();
        return p.ok() ? std::move(*p) : nullptr;
    }
    // Random K and V rows (the same for a seed) stored at `slots` of every layer: from host
    // memory into a host pool, from the device's memory into a device pool.
    Status store(SlotPool& p, const std::vector<int32_t>& slots, uint32_t seed) {
        const auto n = static_cast<int64_t>(slots.size());
        std::mt19937 rng(seed);
        std::normal_distribution<float> dist;
        std::vector<float> rows(static_cast<size_t>(2 * n * kDim));
        for (float& x : rows) x = dist(rng);
        const float* at = rows.data();
        k::Buffer on_device;
        if (p.device() != nullptr) {
            DS_ASSIGN_OR_RETURN(on_device, p.device()->alloc(rows.size() * sizeof(float)));
            DS_RETURN_IF_ERROR(p.device()->copy_in(on_device.data(), rows.data(),
                                                   rows.size() * sizeof(float), k::Exec{}));
            at = on_device.f32();
        }
        for (int32_t l = 0; l < kLayers; ++l)
            DS_RETURN_IF_ERROR(p.store(l, slots, at, at + n * kDim, kDim));
        return Status();
    }
    static std::vector<uint8_t> rows(const SlotPool& p, const std::vector<int32_t>& slots) {
        std::vector<uint8_t> out;
        for (int32_t l = 0; l < kLayers; ++l) {
            std::vector<uint8_t> b(2 * slots.size() * p.row_bytes());
            EXPECT_TRUE(p.read_rows(l, slots, b.data()).ok());
            out.insert(out.end(), b.begin(), b.end());
        }
        return out;
    }
    testing::OwnMemoryBackend device_;
};

TEST_F(SlotPoolOnADevice, ItsRowsAreAHostPoolsBytesAsItGrowsAndShrinks) {
    auto host = pool(nullptr), dev = pool(&device_);
    ASSERT_TRUE(host && dev);
    EXPECT_EQ(host->device(), nullptr);
    EXPECT_EQ(dev->device(), &device_);
    EXPECT_EQ(dev->resident_bytes(), 0u);  // nothing before the first slots
    // Slots taken in steps past the arena's first size: each step grows it, the rows move.
    std::vector<int32_t> live;
    size_t grown = 0;
    for (int step = 0; step < 6; ++step) {
        const int32_t n = 100 + 60 * step;
        auto h = host->allocate(n);
        auto d = dev->allocate(n);
        ASSERT_TRUE(h.ok() && d.ok()) << d.status().to_string();
        ASSERT_EQ(*h, *d);
        ASSERT_TRUE(store(*host, *h, step).ok());
        ASSERT_TRUE(store(*dev, *d, step).ok()) << step;
        live.insert(live.end(), h->begin(), h->end());
        EXPECT_GE(dev->resident_bytes(), grown);
        grown = dev->resident_bytes();
        ASSERT_EQ(rows(*dev, live), rows(*host, live)) << "after step " << step;
    }
    EXPECT_GE(grown, live.size() * host->row_bytes() * 2 * kLayers);
    EXPECT_LE(grown, 2 * live.size() * host->row_bytes() * 2 * kLayers);

    // Most slots freed, the rows above moved down into the holes (as DeltaKV compacts), a
    // zeroed row written, and the arena trimmed: it shrinks, the rows stay.
    const std::vector<int32_t> from(live.end() - 40, live.end());
    const std::vector<int32_t> to(live.begin() + 50, live.begin() + 90);
    for (SlotPool* p : {host.get(), dev.get()}) {
        ASSERT_TRUE(p->move_rows(from, to).ok());
        p->release(std::vector<int32_t>(live.begin() + 90, live.end()));
        ASSERT_TRUE(p->write_rows(1, std::vector<int32_t>{3}, nullptr).ok());
        p->trim();
    }
    std::vector<int32_t> kept(live.begin(), live.begin() + 90);
    EXPECT_LT(dev->resident_bytes(), grown / 2);
    EXPECT_EQ(rows(*dev, kept), rows(*host, kept));
    std::vector<uint8_t> zero(2 * host->row_bytes());
    ASSERT_TRUE(dev->read_rows(1, std::vector<int32_t>{3}, zero.data()).ok());
    EXPECT_EQ(zero, std::vector<uint8_t>(zero.size(), 0));

    // Everything freed: the arena goes.
    host->release(kept);
    dev->release(kept);
    dev->trim();
    EXPECT_EQ(dev->resident_bytes(), 0u);
    EXPECT_EQ(dev->free_slots(), kSlots);
}

TEST_F(SlotPoolOnADevice, AFailureWhileGrowingTakesNothing) {
    auto dev = pool(&device_);
    ASSERT_TRUE(dev);
    auto first = dev->allocate(200);
    ASSERT_TRUE(first.ok());
    ASSERT_TRUE(store(*dev, *first, 7).ok());
    const std::vector<uint8_t> before = rows(*dev, *first);
    const size_t arena = dev->resident_bytes();
    device_.fail_after(0);  // the first row copy of the growth fails
    auto more = dev->allocate(300);
    device_.fail_after(-1);
    ASSERT_FALSE(more.ok());
    EXPECT_EQ(more.status().code(), StatusCode::kInternal) << more.status().to_string();
    EXPECT_EQ(dev->free_slots(), kSlots - 200);
    EXPECT_EQ(dev->resident_bytes(), arena);
    EXPECT_EQ(rows(*dev, *first), before);
    // And again, without the failure.
    more = dev->allocate(300);
    ASSERT_TRUE(more.ok());
    EXPECT_EQ(rows(*dev, *first), before);
}

}  // namespace
}  // namespace deltaserve::kvstore
