#include <spdlog/spdlog.h>

#include "deltaserve/api/membership.h"

namespace deltaserve::api {

Result<std::unique_ptr<Registration>> Registration::start(EtcdClient& etcd, std::string prefix,
                                                          MemberRecord record,
                                                          int64_t ttl_seconds) {
    if (ttl_seconds < 2) return invalid_argument("a member's lease lives at least 2 s");
    DS_RETURN_IF_ERROR(parse_member_record(encode_member_record(record)).status());
    const std::string key = member_key(prefix, record.role, record.name);
    std::unique_ptr<Registration> r(new Registration(etcd, key, std::move(record), ttl_seconds));
    const Status first = r->register_once();
    if (first.code() == StatusCode::kAlreadyExists ||
        first.code() == StatusCode::kInvalidArgument) {
        return first;
    }
    if (!first.ok()) spdlog::warn("etcd: {} is not registered yet: {}", key, first.message());
    r->thread_ = std::thread([p = r.get()] { p->run(); });
    return r;
}

Registration::Registration(EtcdClient& etcd, std::string key, MemberRecord record,
                           int64_t ttl_seconds)
    : etcd_(etcd), key_(std::move(key)), ttl_seconds_(ttl_seconds), record_(std::move(record)) {}

Registration::~Registration() {
    bool abandoned = false;
    {
        std::lock_guard<std::mutex> lock(mu_);
        abandoned = stop_;
        stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    if (abandoned) return;
    const int64_t lease = lease_.load();
    if (lease != 0) {
        const Status s = etcd_.revoke_lease(lease);  // its key goes with it
        if (!s.ok()) spdlog::warn("etcd: {} left to expire: {}", key_, s.message());
    }
}

void Registration::abandon() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
}

Status Registration::register_once() {
    std::string value;
    {
        std::lock_guard<std::mutex> lock(mu_);
        value = encode_member_record(record_);
    }
    // The key may hold this member's earlier life (a restart inside the old lease's TTL) or
    // another member's: taken over only when it names the same address.
    DS_ASSIGN_OR_RETURN(EtcdRange existing, etcd_.get(key_));
    int64_t expected = 0;
    if (!existing.kvs.empty()) {
        const EtcdKeyValue& kv = existing.kvs[0];
        Result<MemberRecord> other = parse_member_record(kv.value);
        if (kv.lease != lease_.load() && other.ok()) {
            std::lock_guard<std::mutex> lock(mu_);
            if (other->rpc != record_.rpc || other->http != record_.http) {
                const std::string at = other->rpc.empty() ? other->http : other->rpc;
                return Status(StatusCode::kAlreadyExists,
                              "etcd: " + key_ + " is registered by a live member at " + at +
                                  " (lease " + std::to_string(kv.lease) +
                                  "); names are one member's");
            }
        }
        expected = kv.mod_revision;
    }
    DS_ASSIGN_OR_RETURN(int64_t lease, etcd_.grant_lease(ttl_seconds_));
    Result<EtcdSwap> put = etcd_.put_if(key_, value, expected, lease);
    if (!put.ok() || !put->done) {
        (void)etcd_.revoke_lease(lease);
        if (!put.ok()) return put.status();
        return aborted("etcd: " + key_ + " changed while it was registered; trying again");
    }
    lease_.store(lease);
    registrations_.fetch_add(1);
    registered_.store(true);
    return Status();
}

Status Registration::update(MemberRecord record) {
    std::string value;
    {
        std::lock_guard<std::mutex> lock(mu_);
        record.role = record_.role;
        record.name = record_.name;
        record_ = std::move(record);
        value = encode_member_record(record_);
    }
    const int64_t lease = lease_.load();
    if (lease == 0)
        return unavailable("etcd: " + key_ + " is not registered yet; written when it is");
    return etcd_.put(key_, value, lease).status();
}

void Registration::run() {
    using namespace std::chrono;
    const auto period = milliseconds(ttl_seconds_ * 1000 / 3);
    auto last_renewed = steady_clock::now();
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
        // Renewed every third of the TTL; tried again sooner while etcd fails.
        const auto wait = registered_.load() ? period : milliseconds(500);
        if (cv_.wait_for(lock, wait, [&] { return stop_; })) break;
        lock.unlock();
        if (lease_.load() == 0) {
            const Status s = register_once();
            if (s.ok()) {
                last_renewed = steady_clock::now();
                spdlog::info("etcd: {} registered (lease {})", key_, lease_.load());
            } else {
                spdlog::debug("etcd: {} not registered: {}", key_, s.message());
            }
        } else {
            Result<int64_t> ttl = etcd_.keep_alive(lease_.load());
            if (ttl.ok()) {
                last_renewed = steady_clock::now();
                registered_.store(true);
            } else if (ttl.status().code() == StatusCode::kNotFound) {
                // etcd was away past the TTL: the lease and the key are gone.
                spdlog::warn("etcd: {} lost its lease; registering again", key_);
                registered_.store(false);
                lease_.store(0);
            } else if (steady_clock::now() - last_renewed > seconds(ttl_seconds_)) {
                registered_.store(false);  // it has expired by now, wherever etcd is
            }
        }
        lock.lock();
    }
}

}  // namespace deltaserve::api
