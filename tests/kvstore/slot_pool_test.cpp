#include "deltaserve/kvstore/slot_pool.h"

#include <gtest/gtest.h>

#include <vector>

#include "deltaserve/kvstore/kv_cache.h"

namespace deltaserve::kvstore {
namespace {

SlotPoolOptions small(int32_t slots) { return {2, 8, slots, kernels::DType::kF32}; }

TEST(SlotPool, AllocatesContiguouslyAndRefusesOverflow) {
    auto pool = SlotPool::create(small(10));
    ASSERT_TRUE(pool.ok());
    auto a = (*pool)->allocate(4);
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(*a, (std::vector<int32_t>{0, 1, 2, 3}));
    auto too_many = (*pool)->allocate(7);
    ASSERT_FALSE(too_many.ok());
    EXPECT_EQ(too_many.error().code(), StatusCode::kResourceExhausted);
    EXPECT_EQ((*pool)->free_slots(), 6);  // nothing taken by the failed request
    (*pool)->release(*a);
    EXPECT_EQ((*pool)->free_slots(), 10);
}

TEST(SlotPool, RejectsBadOptions) {
    EXPECT_FALSE(SlotPool::create({0, 8, 10, kernels::DType::kF32}).ok());
    EXPECT_FALSE(SlotPool::create({2, 8, 10, kernels::DType::kQ4_0}).ok());
}

TEST(FullSequenceCache, StoresViewsTruncatesAndReturnsSlots) {
    auto pool = SlotPool::create(small(16));
    ASSERT_TRUE(pool.ok());
    {
        FullSequenceCache a(**pool), b(**pool);
        ASSERT_TRUE(a.reserve(3).ok());
        ASSERT_TRUE(b.reserve(2).ok());
        std::vector<float> k(3 * 8), v(3 * 8);
        for (size_t i = 0; i < k.size(); ++i) {
            k[i] = float(i);
            v[i] = -float(i);
        }
        a.store(1, 0, 3, k.data(), v.data(), 8);
        const kernels::KvView view = a.view(1, 3);
        EXPECT_EQ(view.n, 3);
        const auto* row2 = reinterpret_cast<const float*>(view.k + view.slots[2] * view.row_stride);
        EXPECT_EQ(row2[5], 21.0f);
        a.commit(3);
        b.commit(2);
        EXPECT_EQ(a.n_tokens(), 3);
        EXPECT_EQ((*pool)->free_slots(), 11);
        a.truncate(1);
        EXPECT_EQ(a.n_tokens(), 1);
        EXPECT_EQ((*pool)->free_slots(), 13);
        // More than the pool holds: an error, and the cache is unchanged.
        EXPECT_EQ(a.reserve(100).code(), StatusCode::kResourceExhausted);
        EXPECT_EQ(a.n_tokens(), 1);
    }
    EXPECT_EQ((*pool)->free_slots(), 16);  // destroyed caches give every slot back
}

}  // namespace
}  // namespace deltaserve::kvstore
