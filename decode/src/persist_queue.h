// Work done beside the decode worker's loop, in order, on one thread of its own: storing a
// session's KV at the end of its turn (session_tiers.h) without stalling the other turns'
// steps. The destructor runs what is queued, then joins.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace deltaserve::decode {

class PersistQueue {
  public:
    PersistQueue() : thread_([this] { run(); }) {}
    ~PersistQueue() {
        {
            std::lock_guard lock(mu_);
            stopping_ = true;
        }
        cv_.notify_all();
        thread_.join();
    }
    PersistQueue(const PersistQueue&) = delete;
    PersistQueue& operator=(const PersistQueue&) = delete;

    void push(std::function<void()> job) {
        {
            std::lock_guard lock(mu_);
            jobs_.push_back(std::move(job));
        }
        cv_.notify_one();
    }

  private:
    void run() {
        std::unique_lock lock(mu_);
        for (;;) {
            cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
            if (jobs_.empty()) return;  // stopping, and nothing left
            auto job = std::move(jobs_.front());
            jobs_.pop_front();
            lock.unlock();
            job();
            lock.lock();
        }
    }

    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::function<void()>> jobs_;
    bool stopping_ = false;
    std::thread thread_;  // last: started once the rest is made
};

}  // namespace deltaserve::decode
