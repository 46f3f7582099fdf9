#include "deltaserve/common/thread_pool.h"

#include <immintrin.h>

namespace deltaserve {

namespace {
// Spin iterations before a worker sleeps: long enough to bridge the gap between two
// matmuls of a decode step, short enough not to burn a core while idle.
constexpr int kSpinIterations = 1 << 16;
// How long the caller spins for stragglers before yielding its core.
constexpr int kCallerSpins = 1 << 12;
}  // namespace

int default_thread_count() {
    const unsigned n = std::thread::hardware_concurrency();
    return n == 0 ? 1 : static_cast<int>(n);
}

ThreadPool::ThreadPool(int n_threads)
    : n_threads_(n_threads > 0 ? n_threads : default_thread_count()) {
    workers_.reserve(n_threads_ - 1);
    for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
    stop_.store(true);
    generation_.fetch_add(1);
    generation_.notify_all();
    for (auto& t : workers_) t.join();
}

void ThreadPool::dispatch(Thunk thunk, void* ctx, bool elastic) {
    if (n_threads_ == 1) {
        thunk(ctx, 0, 1);
        return;
    }
    std::lock_guard<std::mutex> one_region_at_a_time(regions_);
    uint32_t id32 = generation_.load(std::memory_order_relaxed) + 1u;
    if (id32 == 0) id32 = 1;  // 0 means "no region yet" to the workers
    const uint64_t id = id32;
    thunk_ = thunk;
    ctx_ = ctx;
    finished_.store(0, std::memory_order_relaxed);
    state_.store((id << 32) | kOpen, std::memory_order_release);
    // Sequentially consistent store and load, paired with the sleeper's increment and its
    // wait's load: either the sleeper sees the new id, or we see the sleeper and wake it.
    // Most regions find every worker spinning and skip the system call.
    generation_.store(static_cast<uint32_t>(id));
    if (sleepers_.load() > 0) generation_.notify_all();
    thunk(ctx, 0, n_threads_);

    int joined;
    if (elastic) {
        // Whoever has not joined by now is not needed: every chunk is taken.
        joined =
            static_cast<int>(state_.fetch_and(~kOpen, std::memory_order_acq_rel) & kJoinedMask);
    } else {
        joined = n_threads_ - 1;
    }
    // Spin briefly, then yield: when the machine is oversubscribed a worker may be waiting
    // for this very core, and spinning would only delay it by a whole time slice.
    for (int spins = 0; finished_.load(std::memory_order_acquire) != joined; ++spins) {
        if (spins < kCallerSpins) {
            _mm_pause();
        } else {
            std::this_thread::yield();
        }
    }
    if (!elastic) state_.fetch_and(~kOpen, std::memory_order_relaxed);
}

void ThreadPool::worker_loop(int index) {
    // Generation 0 is the constructor's; starting from it (not from a fresh load) means a
    // region dispatched before this thread first ran is still seen.
    uint32_t seen = 0;
    uint64_t last_joined = 0;  // id of the last region this worker ran
    for (;;) {
        int spins = 0;
        uint32_t g;
        while ((g = generation_.load(std::memory_order_acquire)) == seen) {
            if (++spins < kSpinIterations) {
                _mm_pause();
            } else {
                sleepers_.fetch_add(1);
                generation_.wait(seen);
                sleepers_.fetch_sub(1);
            }
        }
        seen = g;
        if (stop_.load()) return;
        // Join the open region, if it still is; a closed one was finished without us.
        uint64_t st = state_.load(std::memory_order_acquire);
        bool joined = false;
        while ((st & kOpen) && (st >> 32) != last_joined) {
            if (state_.compare_exchange_weak(st, st + 1, std::memory_order_acq_rel)) {
                joined = true;
                last_joined = st >> 32;
                break;
            }
        }
        if (!joined) continue;
        thunk_(ctx_, index, n_threads_);
        finished_.fetch_add(1, std::memory_order_release);
    }
}

}  // namespace deltaserve
