// Turns whose thread is blocked in a prefill node's call while their caller may leave: one
// thread asks each watched turn's TurnCallbacks::wanted every kWantedPollMs and, once it says
// no, calls the turn's cancel, again at each poll until the turn is no longer watched (a
// cancel that reached a prefill node before the turn did is then sent again).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "deltaserve/api/chat_engine.h"

namespace deltaserve::api {

class PrefillWatch {
  public:
    PrefillWatch() : thread_([this] { run(); }) {}
    ~PrefillWatch() {
        {
            std::lock_guard<std::mutex> lock(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        thread_.join();
    }
    PrefillWatch(const PrefillWatch&) = delete;
    PrefillWatch& operator=(const PrefillWatch&) = delete;

    // wanted must stay callable until remove(id); cancel is called from the watch's thread.
    void add(uint64_t id, const std::function<bool()>* wanted, std::function<void()> cancel) {
        if (wanted == nullptr || !*wanted) return;
        {
            std::lock_guard<std::mutex> lock(mu_);
            turns_[id] = Watched{wanted, std::move(cancel), false};
        }
        cv_.notify_all();
    }
    // Stops watching the turn; whether it was cancelled.
    bool remove(uint64_t id) {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = turns_.find(id);
        if (it == turns_.end()) return false;
        const bool cancelled = it->second.cancelled;
        turns_.erase(it);
        return cancelled;
    }

  private:
    struct Watched {
        const std::function<bool()>* wanted;
        std::function<void()> cancel;
        bool cancelled;
    };

    void run() {
        std::unique_lock<std::mutex> lock(mu_);
        while (!stop_) {
            if (turns_.empty()) {
                cv_.wait(lock, [&] { return stop_ || !turns_.empty(); });
                continue;
            }
            cv_.wait_for(lock, std::chrono::milliseconds(TurnCallbacks::kWantedPollMs),
                         [&] { return stop_; });
            std::vector<std::function<void()>> cancels;
            for (auto& [id, w] : turns_) {
                if (!w.cancelled && !(*w.wanted)()) w.cancelled = true;
                if (w.cancelled) cancels.push_back(w.cancel);
            }
            lock.unlock();  // a cancel may be an RPC
            for (auto& c : cancels) c();
            lock.lock();
        }
    }

    std::mutex mu_;
    std::condition_variable cv_;
    bool stop_ = false;
    std::map<uint64_t, Watched> turns_;
    std::thread thread_;  // last: it starts once the rest is made
};

}  // namespace deltaserve::api
