// Hand-offs between a thread and a KJ event loop, told to ThreadSanitizer.
//
// KJ synchronises its cross-thread calls (Executor::executeSync) and cross-thread fulfillers
// inside libkj, which Debian does not build with TSan: TSan cannot see those hand-offs and
// reports what one side wrote before one and the other side reads after it as a race. These
// wrappers mark the same hand-offs with TSan's own annotations (nothing in other builds), so
// a TSan report in this module is a real race.
#pragma once

#include <kj/async.h>

#include <optional>
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
template <typename T>
struct PromiseValue {
    using type = T;
};
template <typename T>
struct PromiseValue<kj::Promise<T>> {
    using type = T;
};

// executor.executeSync(f): f runs on the executor's loop after what the caller did before,
// and the caller goes on after f (and the promise it returns, if any) finished, with its
// value or its exception. Both are left where the caller reads them only after the hand-off
// back: KJ would copy them out on the caller's thread before a TSan annotation after
// executeSync could run.
template <typename F>
auto execute_sync(const kj::Executor& executor, F&& f) {
    using R = decltype(f());
    using T = typename PromiseValue<R>::type;
    constexpr bool kVoid = std::is_void_v<T>;
    std::optional<std::conditional_t<kVoid, char, T>> out;
    kj::Maybe<kj::Exception> failed;
    char token = 0;
    handoff_release(&token);
    const auto done = [&] { handoff_release(&token); };
    if constexpr (IsKjPromise<R>::value) {
        executor.executeSync([&]() -> kj::Promise<void> {
            handoff_acquire(&token);
            auto p = kj::evalNow([&] { return f(); });
            if constexpr (kVoid) {
                return p.then([&]() { out.emplace(0), done(); },
                              [&](kj::Exception&& e) { failed = kj::mv(e), done(); });
            } else {
                return p.then([&](T&& v) { out.emplace(kj::mv(v)), done(); },
                              [&](kj::Exception&& e) { failed = kj::mv(e), done(); });
            }
        });
    } else {
        // Not a promise: answered at once (f may stop the loop, as a client's shutdown does).
        executor.executeSync([&]() {
            handoff_acquire(&token);
            KJ_IF_MAYBE (e, kj::runCatchingExceptions([&] {
                             if constexpr (kVoid) {
                                 f();
                             } else {
                                 out.emplace(f());
                             }
                         })) {
                failed = kj::mv(*e);
            }
            done();
        });
    }
    handoff_acquire(&token);
    KJ_IF_MAYBE (e, failed) {
        kj::throwFatalException(kj::mv(*e));
    }
    if constexpr (!kVoid) return std::move(*out);
}

}  // namespace deltaserve::api
