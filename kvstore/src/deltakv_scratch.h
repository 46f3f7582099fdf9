// What the DeltaKV cache's parts share. Private to kvstore/.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "deltaserve/common/status.h"
#include "deltaserve/common/thread_pool.h"

namespace deltaserve::kvstore {

// Scratch that only grows, so steps of varying sizes neither allocate nor clear it.
template <class T>
void grow(std::vector<T>& v, size_t n) {
    if (v.size() < n) v.resize(n);
}

// A failed op inside the cache: its public calls catch it and return the Status (kvstore's
// own; nothing throws past them). In host memory only a bug fails an op (the CPU backend has
// no device to lose); on a device, the device can.
struct OpFailure {
    Status status;
};
inline void must(const Status& st) {
    if (!st.ok()) throw OpFailure{st};
}
template <class T>
T must_get(Result<T> r) {
    must(r.status());
    return std::move(*r);
}

// Points a cache's threads at a call's pool for the call, and back after.
class CallThreads {
  public:
    CallThreads(ThreadPool*& slot, ThreadPool& pool) : slot_(slot), saved_(slot) { slot = &pool; }
    ~CallThreads() { slot_ = saved_; }
    CallThreads(const CallThreads&) = delete;
    CallThreads& operator=(const CallThreads&) = delete;

  private:
    ThreadPool*& slot_;
    ThreadPool* const saved_;
};

}  // namespace deltaserve::kvstore
