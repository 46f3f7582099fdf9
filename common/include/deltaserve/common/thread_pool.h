// A fork-join thread pool built for many small parallel regions per token.
//
// run() executes a function on every thread (the caller is thread 0) and returns when all
// are done. Workers spin briefly between regions before sleeping on an atomic wait, so the
// hundreds of regions a decoded token needs cost microseconds, not syscalls. Not
// reentrant: run() must not be called from inside a region or from two threads at once.
#pragma once

#include <atomic>
#include <cstdint>
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
        dispatch(thunk, &fn);
    }

    // Splits [0, n) into chunks of `grain` handed out dynamically; fn(begin, end).
    template <typename F>
    void parallel_for(int64_t n, int64_t grain, F&& fn) {
        if (n <= 0) return;
        if (grain < 1) grain = 1;
        if (n_threads_ == 1 || n <= grain) {
            fn(int64_t{0}, n);
            return;
        }
        std::atomic<int64_t> next{0};
        run([&](int, int) {
            for (;;) {
                const int64_t b = next.fetch_add(grain, std::memory_order_relaxed);
                if (b >= n) break;
                fn(b, b + grain < n ? b + grain : n);
            }
        });
    }

private:
    using Thunk = void (*)(void*, int, int);
    void dispatch(Thunk thunk, void* ctx);
    void worker_loop(int index);

    int n_threads_;
    std::vector<std::thread> workers_;
    Thunk thunk_ = nullptr;
    void* ctx_ = nullptr;
    std::atomic<uint32_t> generation_{0};
    std::atomic<int> pending_{0};
    std::atomic<bool> stop_{false};
};

// One per hardware thread (at least 1).
int default_thread_count();

}  // namespace deltaserve
