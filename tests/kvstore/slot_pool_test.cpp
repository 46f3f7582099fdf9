#include "deltaserve/kvstore/slot_pool.h"

#include <gtest/gtest.h>

#include <cstring>
#include <span>
#include <vector>

#include <unistd.h>

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

// Slots past the highest in use give their memory back; rows below it keep theirs and their
// values.
TEST(SlotPool, TrimGivesBackTheMemoryPastTheHighestSlotInUse) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    auto pool = SlotPool::create({2, 64, 4096, kernels::DType::kF32});  // rows of 256 bytes
    ASSERT_TRUE(pool.ok());
    SlotPool& p = **pool;
    EXPECT_EQ(p.resident_bytes(), 0u) << "address space until written";
    auto all = p.allocate(4096);
    ASSERT_TRUE(all.ok());
    for (int32_t s : *all) {
        for (int32_t l = 0; l < 2; ++l) {
            std::memset(p.k_row(l, s), s & 0xff, p.row_bytes());
            std::memset(p.v_row(l, s), s & 0xff, p.row_bytes());
        }
    }
    EXPECT_EQ(p.resident_bytes(), p.bytes());
    p.release(std::span<const int32_t>(all->data() + 1024, 3072));
    p.trim();
    // Four runs (2 layers, K and V) of 1024 rows each, a page or so more at their ends.
    EXPECT_LE(p.resident_bytes(), 4 * (1024 * p.row_bytes() + page));
    EXPECT_GE(p.resident_bytes(), 4 * 1024 * p.row_bytes());
    EXPECT_EQ(p.k_row(1, 1023)[0], 1023 & 0xff);
    EXPECT_EQ(p.v_row(0, 1000)[5], 1000 & 0xff);
    auto again = p.allocate(1);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ((*again)[0], 1024);
    EXPECT_EQ(p.k_row(0, 1024)[0], 0) << "a given-back row reads as zeros";
}

TEST(SlotPool, RejectsBadOptions) {
    EXPECT_FALSE(SlotPool::create({0, 8, 10, kernels::DType::kF32}).ok());
    EXPECT_FALSE(SlotPool::create({2, 8, 10, kernels::DType::kQ4_0}).ok());
}

}  // namespace
}  // namespace deltaserve::kvstore
