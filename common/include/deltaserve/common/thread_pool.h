// A fork-join thread pool built for many small parallel regions per token.
//
// run() executes a function on every thread (the caller is thread 0) and returns when all
// are done. Workers spin briefly between regions before sleeping on an atomic wait, so the
// hundreds of regions a decoded token needs cost microseconds, not syscalls. Regions opened
// from several threads (the workers of one process sharing its pool) run one after another.
// Not reentrant: run() must not be called from inside a region.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace deltaserve {

class ThreadPool {
  public:
    // n_threads counts the caller; <= 0 means one per hardware thread.
    explicit ThreadPool(int n_threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return n_threads_; }

    // Calls fn(thread_index, n_threads) once on every thread.
    template <typename F>
    void run(F&& fn) {
        auto thunk = [](void* ctx, int i, int n) { (*static_cast<F*>(ctx))(i, n); };
        dispatch(thunk, &fn, /*elastic=*/false);
    }

    // Splits [0, n) into chunks of `grain` handed out dynamically; fn(begin, end).
    // Elastic: workers that are not running when the region opens (the machine is busy) do
    // not hold it up; the caller takes their chunks.
    template <typename F>
    void parallel_for(int64_t n, int64_t grain, F&& fn) {
        if (n <= 0) return;
        if (grain < 1) grain = 1;
        if (n_threads_ == 1 || n <= grain) {
            fn(int64_t{0}, n);
            return;
        }
        std::atomic<int64_t> next{0};
        auto body = [&](int, int) {
            for (;;) {
                const int64_t b = next.fetch_add(grain, std::memory_order_relaxed);
                if (b >= n) break;
                fn(b, b + grain < n ? b + grain : n);
            }
        };
        auto thunk = [](void* ctx, int i, int nt) { (*static_cast<decltype(body)*>(ctx))(i, nt); };
        dispatch(thunk, &body, /*elastic=*/true);
    }

    // Like parallel_for, but thread t first takes the chunks of its own t-th of [0, n), then
    // helps with the others': calls that repeat a range touch each part's data from the same
    // thread (its cache), while a busy machine still loses nothing to a late worker.
    template <typename F>
    void parallel_for_affine(int64_t n, int64_t grain, F&& fn) {
        if (n <= 0) return;
        if (grain < 1) grain = 1;
        if (n_threads_ == 1 || n <= grain) {
            fn(int64_t{0}, n);
            return;
        }
        struct alignas(64) Part {
            std::atomic<int64_t> next;
            int64_t end;
        };
        constexpr int kMaxParts = 64;  // on the stack: decode calls this per layer
        if (n_threads_ > kMaxParts) {
            parallel_for(n, grain, std::forward<F>(fn));
            return;
        }
        const int parts = n_threads_;
        Part part[kMaxParts];
        for (int t = 0; t < parts; ++t) {
            part[t].next.store(n * t / parts, std::memory_order_relaxed);
            part[t].end = n * (t + 1) / parts;
        }
        auto body = [&](int i, int) {
            for (int k = 0; k < parts; ++k) {
                Part& p = part[(i + k) % parts];
                for (;;) {
                    const int64_t b = p.next.fetch_add(grain, std::memory_order_relaxed);
                    if (b >= p.end) break;
                    fn(b, b + grain < p.end ? b + grain : p.end);
                }
            }
        };
        auto thunk = [](void* ctx, int i, int nt) { (*static_cast<decltype(body)*>(ctx))(i, nt); };
        dispatch(thunk, &body, /*elastic=*/true);
    }

  private:
    using Thunk = void (*)(void*, int, int);
    // Opens a region, runs the caller's part, then closes it. Elastic regions wait only for
    // the workers that joined before the caller finished; others wait for every worker.
    void dispatch(Thunk thunk, void* ctx, bool elastic);
    void worker_loop(int index);

    // Region state: the region's id (high 32 bits), kOpen while workers may join, and the
    // number that joined (low bits). The id lets a worker join each region at most once.
    static constexpr uint64_t kOpen = 1ull << 31;
    static constexpr uint64_t kJoinedMask = kOpen - 1;

    int n_threads_;
    std::mutex regions_;  // held by the thread whose region is open
    std::vector<std::thread> workers_;
    Thunk thunk_ = nullptr;
    void* ctx_ = nullptr;
    std::atomic<uint32_t> generation_{0};  // the current region's id; workers sleep on it
    std::atomic<uint64_t> state_{0};
    std::atomic<int> finished_{0};
    std::atomic<int> sleepers_{0};  // workers blocked in generation_.wait
    std::atomic<bool> stop_{false};
};

// One per hardware thread (at least 1).
int default_thread_count();

}  // namespace deltaserve
