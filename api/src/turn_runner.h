// Runs blocking work (a chat turn: ChatEngine::run_turn waits for its pieces) on a bounded
// set of threads with a bounded queue, so that no number of requests grows the threads.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace deltaserve::api {

class TurnRunner {
  public:
    TurnRunner(int threads, int max_queued) : capacity_(threads + max_queued) {
        for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { work(); });
    }
    TurnRunner(const TurnRunner&) = delete;
    TurnRunner& operator=(const TurnRunner&) = delete;
    ~TurnRunner() {
        {
            std::lock_guard<std::mutex> lock(mu_);
            stopping_ = true;
        }
        cv_.notify_all();
        for (auto& t : threads_) t.join();
    }

    // Queues fn; its ticket (> 0), or 0 (fn dropped) when every thread is taken and the queue
    // is full. A thread counts as free from its start, not from when it first waits: a
    // request that comes before the threads have started is queued, not refused.
    uint64_t try_submit(std::function<void()> fn) {
        uint64_t ticket = 0;
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (stopping_ || static_cast<int>(queue_.size()) + busy_ >= capacity_) return 0;
            ticket = ++last_ticket_;
            queue_.push_back({ticket, std::move(fn)});
        }
        cv_.notify_one();
        return ticket;
    }

    // Takes a queued fn out of the queue (it never runs); false when it started already.
    bool cancel(uint64_t ticket) {
        std::function<void()> dropped;  // destroyed outside the lock: it may own a connection
        std::lock_guard<std::mutex> lock(mu_);
        for (auto it = queue_.begin(); it != queue_.end(); ++it) {
            if (it->ticket != ticket) continue;
            dropped = std::move(it->fn);
            queue_.erase(it);
            if (queue_.empty() && busy_ == 0) done_.notify_all();
            return true;
        }
        return false;
    }

    // Waits until nothing is queued or running.
    void wait_idle() {
        std::unique_lock<std::mutex> lock(mu_);
        done_.wait(lock, [&] { return queue_.empty() && busy_ == 0; });
    }

    // The same, for at most `timeout`; false if work remains.
    template <typename Duration>
    bool wait_idle_for(Duration timeout) {
        std::unique_lock<std::mutex> lock(mu_);
        return done_.wait_for(lock, timeout, [&] { return queue_.empty() && busy_ == 0; });
    }

    int busy() const {
        std::lock_guard<std::mutex> lock(mu_);
        return busy_;
    }

  private:
    void work() {
        std::unique_lock<std::mutex> lock(mu_);
        for (;;) {
            cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
            if (queue_.empty()) return;  // stopping
            auto fn = std::move(queue_.front().fn);
            queue_.pop_front();
            ++busy_;
            lock.unlock();
            fn();
            lock.lock();
            --busy_;
            if (queue_.empty() && busy_ == 0) done_.notify_all();
        }
    }

    struct Queued {
        uint64_t ticket;
        std::function<void()> fn;
    };

    const int capacity_;  // threads + queue
    mutable std::mutex mu_;
    std::condition_variable cv_, done_;
    std::deque<Queued> queue_;
    uint64_t last_ticket_ = 0;
    std::vector<std::thread> threads_;
    int busy_ = 0;
    bool stopping_ = false;
};

}  // namespace deltaserve::api
