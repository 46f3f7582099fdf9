// Hand-offs between a thread and a KJ event loop, told to ThreadSanitizer.
//
// KJ synchronises its cross-thread calls (Executor::executeSync) and cross-thread fulfillers
// inside libkj, which Debian does not build with TSan: TSan cannot see those hand-offs and
// reports what one side wrote before one and the other side reads after it as a race. These
// wrappers mark the same hand-offs with TSan's own annotations (nothing in other builds), so
// a TSan report in this module is a real race.
#pragma once

#include <kj/async.h>

#include <type_traits>
#include <utility>

#if defined(__SANITIZE_THREAD__)
#define DELTASERVE_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define DELTASERVE_TSAN 1
#endif
#endif

#ifdef DELTASERVE_TSAN
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

namespace deltaserve::api {

// What this thread did before handoff_release(p) happens before what a thread does after a
// later handoff_acquire(p): the two ends of one hand-off KJ makes.
inline void handoff_release([[maybe_unused]] const void* p) {
#ifdef DELTASERVE_TSAN
    __tsan_release(const_cast<void*>(p));
#endif
}
inline void handoff_acquire([[maybe_unused]] const void* p) {
#ifdef DELTASERVE_TSAN
    __tsan_acquire(const_cast<void*>(p));
#endif
}

template <typename T>
struct IsKjPromise : std::false_type {};
template <typename T>
struct IsKjPromise<kj::Promise<T>> : std::true_type {};

// executor.executeSync(f): f runs on the executor's loop after what the caller did before,
// and the caller goes on after f (and the promise it returns, if any) finished.
template <typename F>
auto execute_sync(const kj::Executor& executor, F&& f) {
    char token = 0;
    handoff_release(&token);
    KJ_DEFER(handoff_acquire(&token));
    return executor.executeSync([&]() {
        handoff_acquire(&token);
        if constexpr (IsKjPromise<decltype(f())>::value) {
            return f().attach(kj::defer([&token] { handoff_release(&token); }));
        } else {
            KJ_DEFER(handoff_release(&token));
            return f();
        }
    });
}

}  // namespace deltaserve::api
