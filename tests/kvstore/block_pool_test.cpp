// Paged KV memory: blocks handed out and shared by reference count, full-KV sequences over
// block tables, a prefix's blocks shared and copied before a write, and the reclaimer.
#include "deltaserve/kvstore/block_pool.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "deltaserve/kvstore/kv_cache.h"

namespace deltaserve::kvstore {
namespace {

constexpr int32_t kB = BlockPool::kBlockTokens;
constexpr int32_t kDim = 8;

BlockPoolOptions small(int32_t blocks) { return {2, kDim, 1, kernels::DType::kF32, blocks}; }

// Stores n tokens whose K rows are (base + i) in every element, V rows -(base + i), in
// every layer.
void append(FullSequenceCache& c, int32_t n, float base) {
    ASSERT_TRUE(c.reserve(n).ok());
    std::vector<float> k(static_cast<size_t>(n) * kDim), v(k.size());
    for (int32_t i = 0; i < n; ++i) {
        for (int32_t d = 0; d < kDim; ++d) {
            k[i * kDim + d] = base + static_cast<float>(i);
            v[i * kDim + d] = -(base + static_cast<float>(i));
        }
    }
    for (int32_t l = 0; l < 2; ++l) EXPECT_TRUE(c.store(l, 0, n, k.data(), v.data(), kDim).ok());
    EXPECT_TRUE(c.commit(n).ok());
}

float k_at(const FullSequenceCache& c, int32_t layer, int32_t pos) {
    const kernels::KvView view = c.view(layer, 0);
    return reinterpret_cast<const float*>(view.k + view.slots[pos] * view.row_stride)[3];
}

TEST(BlockPool, HandsOutLowestFirstCountsReferencesAndRefusesOverflow) {
    auto pool = BlockPool::create(small(4));
    ASSERT_TRUE(pool.ok());
    BlockPool& p = **pool;
    EXPECT_EQ(p.block_bytes(), size_t{kB} * kDim * 4 * 2 * 2);
    auto a = p.allocate(3);
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(*a, (std::vector<int32_t>{0, 1, 2}));
    const auto too_many = p.allocate(2);
    ASSERT_FALSE(too_many.ok());
    EXPECT_EQ(too_many.error().code(), StatusCode::kResourceExhausted);
    EXPECT_EQ(p.free_blocks(), 1);  // nothing taken by the failed request
    p.retain(std::span<const int32_t>(a->data(), 1));
    EXPECT_EQ(p.refs(0), 2);
    p.release(*a);
    EXPECT_EQ(p.refs(0), 1);  // still held by its second reference
    EXPECT_EQ(p.free_blocks(), 3);
    auto b = p.allocate(1);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ((*b)[0], 1);  // the lowest free one
    p.release(std::span<const int32_t>(a->data(), 1));
    p.release(*b);
    EXPECT_EQ(p.free_blocks(), 4);
    EXPECT_EQ(p.peak_blocks(), 3);
}

TEST(BlockPool, RejectsBadOptionsAndSizesBudgets) {
    EXPECT_FALSE(BlockPool::create({0, kDim, 1, kernels::DType::kF32, 4}).ok());
    EXPECT_FALSE(BlockPool::create({2, kDim, 1, kernels::DType::kQ4_0, 4}).ok());
    EXPECT_FALSE(BlockPool::create({2, kDim, 3, kernels::DType::kF32, 4}).ok());
    EXPECT_EQ(BlockPool::blocks_in(small(0), 10 * BlockPool::block_bytes(small(0)) + 5), 10);
    EXPECT_EQ(BlockPool::blocks_in(small(0), 1), 1);
}

TEST(BlockPool, AsksTheReclaimerForWhatIsMissing) {
    auto pool = BlockPool::create(small(2));
    ASSERT_TRUE(pool.ok());
    BlockPool& p = **pool;
    auto held = p.allocate(2);
    ASSERT_TRUE(held.ok());
    int32_t asked = 0;
    p.set_reclaimer([&](int32_t missing) {
        asked = missing;
        p.release(std::span<const int32_t>(held->data(), 1));  // gives one back, as a cache would
    });
    auto one = p.allocate(1);
    ASSERT_TRUE(one.ok());
    EXPECT_EQ(asked, 1);
    EXPECT_EQ((*one)[0], (*held)[0]);
    // Nothing left to give: a clear error.
    p.set_reclaimer([&](int32_t missing) { asked = missing; });
    EXPECT_EQ(p.allocate(2).status().code(), StatusCode::kResourceExhausted);
    EXPECT_EQ(asked, 2);
    p.release(*one);
    p.release(std::span<const int32_t>(held->data() + 1, 1));
    EXPECT_EQ(p.free_blocks(), 2);
}

TEST(BlockPool, ThreadsAllocatingAndReleasingLoseNoBlock) {
    auto pool = BlockPool::create(small(64));
    ASSERT_TRUE(pool.ok());
    BlockPool& p = **pool;
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
        threads.emplace_back([&] {
            for (int i = 0; i < 2000; ++i) {
                auto b = p.allocate(1 + i % 5);
                if (!b.ok()) continue;
                p.retain(*b);
                p.release(*b);
                p.release(*b);
            }
        });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(p.free_blocks(), 64);
}

TEST(FullSequenceCache, StoresViewsTruncatesAndReturnsBlocks) {
    auto pool = BlockPool::create(small(4));
    ASSERT_TRUE(pool.ok());
    {
        FullSequenceCache a(*pool), b(*pool);
        append(a, 3, 0.0f);
        append(b, 2, 100.0f);
        EXPECT_EQ(a.view(1, 0).n, 3);
        EXPECT_EQ(k_at(a, 1, 2), 2.0f);
        EXPECT_EQ(k_at(b, 0, 1), 101.0f);
        EXPECT_EQ((*pool)->free_blocks(), 2);  // a block each
        append(a, kB, 3.0f);                   // 19 tokens: a second block
        EXPECT_EQ(k_at(a, 0, 18), 18.0f);
        EXPECT_EQ(a.held_bytes(), 2 * (*pool)->block_bytes());
        EXPECT_EQ(a.bytes(), size_t{19} * kDim * 4 * 2 * 2);  // the rows of 19 tokens
        EXPECT_EQ((*pool)->free_blocks(), 1);
        a.truncate(kB);
        EXPECT_EQ(a.n_tokens(), kB);
        EXPECT_EQ((*pool)->free_blocks(), 2);
        // More than the pool holds: an error, and the cache is unchanged.
        EXPECT_EQ(a.reserve(100).code(), StatusCode::kResourceExhausted);
        EXPECT_EQ(a.n_tokens(), kB);
        EXPECT_EQ(a.bytes_bound(kB + 1), 3 * (*pool)->block_bytes());  // 2 blocks + a copy
    }
    EXPECT_EQ((*pool)->free_blocks(), 4);  // destroyed caches give every block back
}

TEST(FullSequenceCache, SharesWholeBlocksAndCopiesOneBeforeWritingIntoIt) {
    auto pool = BlockPool::create(small(8));
    ASSERT_TRUE(pool.ok());
    FullSequenceCache a(*pool);
    append(a, 2 * kB + 5, 0.0f);
    const std::vector<int32_t> shared = a.blocks(2);
    ASSERT_EQ(shared.size(), 2u);
    {
        FullSequenceCache b(*pool);
        ASSERT_TRUE(b.adopt_blocks(shared).ok());
        EXPECT_EQ(b.n_tokens(), 2 * kB);
        EXPECT_EQ((*pool)->refs(shared[0]), 2);
        EXPECT_EQ((*pool)->free_blocks(), 5);  // nothing copied
        EXPECT_EQ(k_at(b, 1, 2 * kB - 1), 2.0f * kB - 1);
        // b goes on after the shared blocks: a new block, the shared ones untouched.
        append(b, 1, 500.0f);
        EXPECT_EQ(k_at(b, 0, 2 * kB), 500.0f);
        EXPECT_EQ(k_at(a, 0, 2 * kB), 2.0f * kB);
        // b diverges inside the second shared block: it writes into a copy.
        b.truncate(kB + 4);
        EXPECT_EQ((*pool)->refs(shared[1]), 2);
        append(b, 3, 900.0f);
        EXPECT_EQ((*pool)->refs(shared[1]), 1);
        EXPECT_EQ(k_at(b, 1, kB + 3), kB + 3.0f);  // copied from the shared block
        EXPECT_EQ(k_at(b, 1, kB + 4), 900.0f);
        EXPECT_EQ(k_at(a, 1, kB + 4), kB + 4.0f);  // a's own rows are as they were
        // Adopting needs an empty cache.
        EXPECT_EQ(b.adopt_blocks(shared).code(), StatusCode::kFailedPrecondition);
    }
    EXPECT_EQ((*pool)->refs(shared[0]), 1);
    EXPECT_EQ((*pool)->free_blocks(), 5);  // a's 3 blocks remain
}

TEST(FullSequenceCache, ShipsRowsAcrossBlocks) {
    auto pool = BlockPool::create(small(8));
    ASSERT_TRUE(pool.ok());
    FullSequenceCache a(*pool), b(*pool);
    append(a, kB + 7, 10.0f);
    auto state = a.export_state();
    ASSERT_TRUE(state.ok());
    ASSERT_TRUE(b.import_state(*state).ok());
    for (int32_t l = 0; l < 2; ++l) {
        auto part = a.export_layer(l);
        ASSERT_TRUE(part.ok());
        ASSERT_TRUE(b.import_layer(l, *part).ok());
    }
    for (int32_t pos : {0, kB - 1, kB, kB + 6}) EXPECT_EQ(k_at(b, 1, pos), k_at(a, 1, pos));
    std::vector<uint8_t> short_part(3);
    EXPECT_EQ(b.import_layer(0, short_part).code(), StatusCode::kDataLoss);
}

TEST(FullSequenceCache, AStateOfMoreTokensThanItsContextIsRefusedAndTakesNothing) {
    auto pool = BlockPool::create(small(8));
    ASSERT_TRUE(pool.ok());
    FullSequenceCache a(*pool), b(*pool, /*max_tokens=*/kB * 2);
    append(a, kB * 3, 0.0f);
    auto state = a.export_state();
    ASSERT_TRUE(state.ok());
    const int32_t before = (*pool)->free_blocks();
    EXPECT_EQ(b.import_state(*state).code(), StatusCode::kResourceExhausted);
    // A token count near the largest int: no overflow, no block taken.
    std::vector<uint8_t> huge = *state;
    const int32_t n = std::numeric_limits<int32_t>::max();
    std::memcpy(huge.data(), &n, sizeof(n));
    FullSequenceCache c(*pool);
    EXPECT_EQ(c.import_state(huge).code(), StatusCode::kResourceExhausted);
    EXPECT_EQ((*pool)->free_blocks(), before);
    EXPECT_EQ(b.n_tokens(), 0);
    EXPECT_EQ(c.n_tokens(), 0);
}

}  // namespace
}  // namespace deltaserve::kvstore
