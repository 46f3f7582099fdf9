#include "deltaserve/common/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace deltaserve {
namespace {

TEST(ThreadPool, RunCallsEveryThreadOnce) {
    for (int n : {1, 2, 3}) {
        ThreadPool pool(n);
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        pool.run([&](int i, int nt) {
            EXPECT_EQ(nt, n);
            hits[static_cast<size_t>(i)]++;
        });
        for (auto& h : hits) EXPECT_EQ(h.load(), 1);
    }
}

TEST(ThreadPool, FirstRegionRightAfterConstructionIsNotLost) {
    // A worker that starts after the first dispatch must still run it (a past deadlock).
    for (int rep = 0; rep < 200; ++rep) {
        ThreadPool pool(3);
        std::atomic<int> count{0};
        pool.run([&](int, int) { count++; });
        ASSERT_EQ(count.load(), 3);
    }
}

TEST(ThreadPool, ParallelForCoversTheRangeExactlyOnce) {
    ThreadPool pool(2);
    for (int64_t n : {0, 1, 7, 1000, 4099}) {
        std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
        pool.parallel_for(n, 16, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) seen[static_cast<size_t>(i)]++;
        });
        for (auto& s : seen) ASSERT_EQ(s.load(), 1);
    }
}

TEST(ThreadPool, AffineParallelForCoversTheRangeExactlyOnceInItsParts) {
    for (int threads : {2, 3}) {
        ThreadPool pool(threads);
        for (int64_t n : {0, 1, 7, 1000, 4099}) {
            std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
            pool.parallel_for_affine(n, 16, [&](int64_t b, int64_t e) {
                // A chunk never crosses from one thread's part into the next (a range of
                // one chunk is a single call).
                int64_t part = 0;
                while (b >= n * (part + 1) / threads) ++part;
                if (n > 16) EXPECT_LE(e, n * (part + 1) / threads) << b;
                for (int64_t i = b; i < e; ++i) seen[static_cast<size_t>(i)]++;
            });
            for (auto& s : seen) ASSERT_EQ(s.load(), 1);
        }
    }
}

TEST(ThreadPool, ManySmallRegions) {
    ThreadPool pool(2);
    std::atomic<int64_t> sum{0};
    for (int i = 0; i < 20000; ++i) pool.run([&](int t, int) { sum += t + 1; });
    EXPECT_EQ(sum.load(), 20000 * 3);
}

}  // namespace
}  // namespace deltaserve

namespace deltaserve {
namespace {

// With every core busy elsewhere, regions still complete, exactly once per index / chunk.
TEST(ThreadPool, CorrectWhenTheMachineIsOversubscribed) {
    std::atomic<bool> stop{false};
    std::vector<std::thread> hogs;
    for (int i = 0; i < 4; ++i) {
        hogs.emplace_back([&] {
            volatile uint64_t x = 0;
            while (!stop.load(std::memory_order_relaxed)) x = x + 1;
        });
    }
    ThreadPool pool(2);
    int64_t total = 0;
    for (int rep = 0; rep < 300; ++rep) {
        std::vector<int> seen(64, 0);
        pool.parallel_for(64, 4, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) seen[static_cast<size_t>(i)]++;
        });
        for (int v : seen) ASSERT_EQ(v, 1);
        std::fill(seen.begin(), seen.end(), 0);
        pool.parallel_for_affine(64, 4, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) seen[static_cast<size_t>(i)]++;
        });
        for (int v : seen) ASSERT_EQ(v, 1);
        std::atomic<int> calls{0};
        pool.run([&](int, int) { calls++; });
        ASSERT_EQ(calls.load(), 2);
        total += 1;
    }
    stop.store(true);
    for (auto& t : hogs) t.join();
    EXPECT_EQ(total, 300);
}

}  // namespace
}  // namespace deltaserve

namespace deltaserve {
namespace {

// A process's workers share one pool (serve's decode and prefill workers): regions opened
// from several threads at once each run whole, one after another.
TEST(ThreadPool, RegionsFromSeveralThreadsEachRunWhole) {
    ThreadPool pool(2);
    std::atomic<int> inside{0};
    std::atomic<bool> overlapped{false};
    auto caller = [&](int64_t* covered) {
        for (int rep = 0; rep < 2000; ++rep) {
            std::vector<int> seen(32, 0);
            pool.parallel_for(32, 4, [&](int64_t b, int64_t e) {
                for (int64_t i = b; i < e; ++i) seen[static_cast<size_t>(i)]++;
            });
            *covered += std::count(seen.begin(), seen.end(), 1);
            pool.run([&](int t, int) {
                if (t != 0) return;
                if (inside.fetch_add(1) != 0) overlapped = true;
                const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(20);
                while (std::chrono::steady_clock::now() < until) {
                }
                inside.fetch_sub(1);
            });
        }
    };
    int64_t a = 0, b = 0;
    std::thread other(caller, &b);
    caller(&a);
    other.join();
    EXPECT_EQ(a, 2000 * 32);
    EXPECT_EQ(b, 2000 * 32);
    EXPECT_FALSE(overlapped.load());
}

}  // namespace
}  // namespace deltaserve
