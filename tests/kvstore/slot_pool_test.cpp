#include "deltaserve/kvstore/slot_pool.h"

#include <gtest/gtest.h>

#include <vector>

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

}  // namespace
}  // namespace deltaserve::kvstore
