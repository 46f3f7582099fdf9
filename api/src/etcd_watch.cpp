#include <algorithm>

#include "deltaserve/api/etcd_client.h"
#include "deltaserve/common/logging.h"
#include "etcd_http.h"
#include "etcd_json.h"

namespace deltaserve::api {
namespace {

// How long a watch waits between tries while etcd cannot be reached.
constexpr std::chrono::milliseconds kFirstBackoff{100};
constexpr std::chrono::milliseconds kLastBackoff{2000};

}  // namespace

EtcdWatch::EtcdWatch(EtcdClient& client, std::string prefix,
                     std::function<void(const EtcdWatchUpdate&)> on_update)
    : client_(client), prefix_(std::move(prefix)), on_update_(std::move(on_update)) {
    thread_ = std::thread([this] { run(); });
}

EtcdWatch::~EtcdWatch() {
    stop_.store(true);
    {
        std::lock_guard<std::mutex> lock(cancel_mu_);
        if (cancel_) cancel_();
    }
    if (thread_.joinable()) thread_.join();
}

void EtcdWatch::run() {
    std::chrono::milliseconds backoff = kFirstBackoff;
    while (!stop_.load()) {
        if (resync_) {
            Result<EtcdRange> r = client_.get_prefix(prefix_);
            if (r.ok()) {
                EtcdWatchUpdate u;
                u.snapshot = true;
                u.kvs = std::move(r->kvs);
                u.revision = r->revision;
                next_ = r->revision + 1;
                revision_.store(r->revision);
                resync_ = false;
                on_update_(u);
            } else {
                spdlog::debug("etcd watch of '{}': {}", prefix_, r.error().message());
            }
        }
        const int64_t before = revision_.load();
        if (!resync_) follow_stream();
        connected_.store(false);
        if (stop_.load()) break;
        // The wait before the next stream: 100 ms, doubling to 2 s while streams bring
        // nothing (etcd away, or idle past watch_idle); one that brought events resets it.
        // Nothing is missed meanwhile: the next stream starts at the revision after the last.
        if (revision_.load() != before) backoff = kFirstBackoff;
        const auto until = std::chrono::steady_clock::now() + backoff;
        while (!stop_.load() && std::chrono::steady_clock::now() < until) {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        backoff = std::min(backoff * 2, kLastBackoff);
    }
}

void EtcdWatch::follow_stream() {
    const EtcdOptions& o = client_.options();
    const size_t n = o.endpoints.size();
    Result<std::string> token = client_.token();
    if (!token.ok()) return;
    // The client's endpoint, or the ones after it while streams there fail to open.
    const size_t i = (client_.current_endpoint() + failures_) % n;
    const etcd::Endpoint endpoint = etcd::parse_endpoint(o.endpoints[i]).value();
    auto stream = std::make_shared<etcd::Stream>();
    {
        std::lock_guard<std::mutex> lock(cancel_mu_);
        if (stop_.load()) return;
        cancel_ = [stream] { stream->cancel(); };
    }
    struct Clear {
        EtcdWatch* w;
        ~Clear() {
            std::lock_guard<std::mutex> lock(w->cancel_mu_);
            w->cancel_ = nullptr;
        }
    } clear{this};
    streams_.fetch_add(1);
    const Status opened = stream->open(
        endpoint, "/v3/watch", etcd::watch_request(prefix_, etcd::prefix_end(prefix_), next_),
        *token, o.timeout);
    if (!opened.ok()) {
        ++failures_;
        if (etcd::is_token_refused(opened)) client_.forget_token(*token);
        spdlog::debug("etcd watch of '{}' on {}: {}", prefix_, o.endpoints[i], opened.message());
        return;
    }
    while (!stop_.load()) {
        Result<std::optional<std::string>> line = stream->next(o.watch_idle);
        if (!line.ok() || !line->has_value()) return;  // idle, broken or ended: open again
        Result<etcd::WatchMessage> m = etcd::parse_watch_message(**line);
        if (!m.ok()) {
            if (etcd::is_token_refused(m.error())) client_.forget_token(*token);
            spdlog::warn("etcd watch of '{}' on {}: {}", prefix_, o.endpoints[i],
                         m.error().message());
            return;
        }
        if (m->created) {
            connected_.store(true);
            failures_ = 0;
        }
        if (m->canceled) {
            // Compacted past where it resumes: the events between are gone; read it all again.
            if (m->compact_revision > 0) resync_ = true;
            spdlog::debug("etcd watch of '{}' cancelled: {}", prefix_, m->cancel_reason);
            return;
        }
        if (m->events.empty()) continue;
        EtcdWatchUpdate u;
        u.revision = m->revision;
        for (const EtcdEvent& e : m->events) next_ = std::max(next_, e.kv.mod_revision + 1);
        u.events = std::move(m->events);
        revision_.store(next_ - 1);
        on_update_(u);
    }
}

}  // namespace deltaserve::api
