#include "cluster_membership.h"

#include <cstdio>
#include <cstdlib>
#include <thread>

#include "deltaserve/api/version.h"

namespace deltaserve::cli {

Result<std::unique_ptr<api::EtcdClient>> connect_etcd(const api::ClusterConfig& config) {
    if (config.etcd.empty()) return std::unique_ptr<api::EtcdClient>();
    api::EtcdOptions o;
    o.endpoints = config.etcd;
    o.user = config.etcd_user;
    o.password = config.etcd_password;
    return api::EtcdClient::create(o);
}

Result<std::unique_ptr<ClusterMembership>> join_cluster(const api::ClusterConfig& config,
                                                        api::MemberRecord record) {
    DS_ASSIGN_OR_RETURN(std::unique_ptr<api::EtcdClient> etcd, connect_etcd(config));
    if (!etcd) return std::unique_ptr<ClusterMembership>();
    record.version = api::deltaserve_version();
    record.started_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
    auto m = std::make_unique<ClusterMembership>();
    m->record = record;
    DS_ASSIGN_OR_RETURN(m->registration, api::Registration::start(*etcd, config.etcd_prefix, record,
                                                                  config.member_ttl));
    m->etcd = std::move(etcd);
    std::fprintf(
        stderr, "deltaserve: %s in etcd as %s%s\n",
        m->registration->registered() ? "registered" : "registering (etcd not reached yet)",
        m->registration->key().c_str(), m->registration->registered() ? "" : "; serving meanwhile");
    return m;
}

ReadyFile::ReadyFile(std::string path, const ClusterMembership* membership)
    : path_(std::move(path)) {
    if (path_.empty()) return;
    thread_ = std::thread([this, membership] {
        while (!stop_.load() && membership != nullptr && !membership->registration->registered()) {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        if (stop_.load()) return;
        if (std::FILE* f = std::fopen(path_.c_str(), "w")) {
            std::fputs("ready\n", f);
            std::fclose(f);
        } else {
            std::fprintf(stderr, "deltaserve: cannot write the ready file %s\n", path_.c_str());
        }
    });
}

void ReadyFile::withdraw() {
    if (path_.empty()) return;
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    std::remove(path_.c_str());
}

ReadyFile::~ReadyFile() { withdraw(); }

void drain_and_leave(ClusterMembership& membership, const std::function<int64_t()>& busy,
                     std::chrono::seconds limit) {
    api::Registration& r = *membership.registration;
    api::MemberRecord draining = membership.record;
    draining.draining = true;
    if (Status s = r.update(draining); !s.ok()) {
        std::fprintf(stderr, "deltaserve: draining not written to etcd: %s\n", s.message().c_str());
    }
    const auto until = std::chrono::steady_clock::now() + limit;
    int64_t left = busy();
    std::fprintf(stderr, "deltaserve: draining: %lld turns running\n",
                 static_cast<long long>(left));
    while (left > 0 && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        left = busy();
    }
    if (left > 0) {
        std::fprintf(stderr, "deltaserve: drained for %lld s; %lld turns still running are ended\n",
                     static_cast<long long>(limit.count()), static_cast<long long>(left));
    }
    membership.registration.reset();  // revokes the lease: the key goes now
    std::fprintf(stderr, "deltaserve: left the cluster\n");
}

}  // namespace deltaserve::cli
