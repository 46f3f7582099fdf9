// A Cap'n Proto RPC server on an event-loop thread of its own (kj objects belong to one
// thread): serves a bootstrap capability on an address until destroyed. Other threads reach
// the loop through executor(). Work that blocks (a prefill, a chat turn) runs on a fixed set
// of worker threads (spawn()), with a bounded queue: no call starts a thread of its own.
// Messages are read with limits set here (kReaderOptions), not the library's defaults.
#pragma once

#include <capnp/ez-rpc.h>
#include <kj/async.h>

#include <functional>
#include <future>
#include <list>
#include <mutex>
#include <string>
#include <thread>

#include "deltaserve/common/status.h"
#include "kj_handoff.h"
#include "turn_runner.h"

namespace deltaserve::api {

// What one RPC message may cost to read: 4 Mi words (32 MiB; a turn of 128k tokens is 0.5
// MiB) and 16 levels of nesting (the schemas use 4).
inline capnp::ReaderOptions rpc_reader_options() {
    capnp::ReaderOptions o;
    o.traversalLimitInWords = uint64_t{1} << 22;
    o.nestingLimit = 16;
    return o;
}

class RpcThread {
  public:
    // workers: threads for blocking calls; queued: calls that may wait for one.
    explicit RpcThread(int workers = 16, int queued = 64) : workers_(workers, queued) {}
    RpcThread(const RpcThread&) = delete;
    RpcThread& operator=(const RpcThread&) = delete;
    ~RpcThread() noexcept { stop(); }

    // Serves what make_bootstrap returns (called on the loop thread) on "host:port".
    // Errors: kUnavailable when the address cannot be bound.
    Status start(const std::string& address,
                 std::function<capnp::Capability::Client()> make_bootstrap) {
        std::promise<Status> started;
        auto ready = started.get_future();
        thread_ = std::thread([&, address] {
            try {
                capnp::EzRpcServer server(make_bootstrap(), address.c_str(), 0,
                                          rpc_reader_options());
                auto& ws = server.getWaitScope();
                port_ = static_cast<uint16_t>(server.getPort().wait(ws));
                auto paf = kj::newPromiseAndFulfiller<void>();
                stop_ = kj::mv(paf.fulfiller);
                loop_thread_ = std::this_thread::get_id();
                executor_ = kj::getCurrentThreadExecutor().addRef();
                started.set_value(Status());
                paf.promise.wait(ws);
                stop_ = nullptr;  // kj objects die on their own thread
            } catch (const kj::Exception& e) {
                if (!executor_) {
                    started.set_value(unavailable("cannot serve RPC on " + address + ": " +
                                                  e.getDescription().cStr()));
                }
            }
        });
        return ready.get();
    }

    void stop() noexcept {
        if (executor_) {
            try {
                execute_sync(*executor_, [this] {
                    if (stop_) stop_->fulfill();
                });
            } catch (const kj::Exception&) {
            }
        }
        if (thread_.joinable()) thread_.join();
        workers_.wait_idle();
    }

    uint16_t port() const { return port_; }
    const kj::Executor& executor() const { return *executor_; }
    bool on_loop_thread() const { return std::this_thread::get_id() == loop_thread_; }
    // Runs f on a worker thread; false (f dropped) when every worker is busy and the queue
    // is full: the caller answers kResourceExhausted.
    [[nodiscard]] bool spawn(std::function<void()> f) { return workers_.try_submit(std::move(f)); }

  private:
    std::thread thread_;
    std::thread::id loop_thread_;
    kj::Own<const kj::Executor> executor_;
    kj::Own<kj::PromiseFulfiller<void>> stop_;
    uint16_t port_ = 0;
    TurnRunner workers_;
};

// Holds a kj object for a std::function or std::thread, whose destructors must not throw.
template <typename T>
struct NoexceptHolder {
    explicit NoexceptHolder(kj::Own<T> o) : own(kj::mv(o)) {}
    ~NoexceptHolder() noexcept = default;
    kj::Own<T> own;
};

}  // namespace deltaserve::api
