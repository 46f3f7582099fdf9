// A cluster process's place in etcd (api/membership.h), when its config names etcd: the
// client, its registration, and the drain a stop signal starts (take no new turn, finish the
// running ones, then leave).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "deltaserve/api/cluster_config.h"
#include "deltaserve/api/membership.h"

namespace deltaserve::cli {

struct ClusterMembership {
    api::MemberRecord record;  // as registered
    std::unique_ptr<api::EtcdClient> etcd;
    std::unique_ptr<api::Registration> registration;  // destroyed first: it uses etcd
    ~ClusterMembership() { registration.reset(); }
};

// The etcd client of a config that names etcd; nullptr (and OK) for one that does not.
Result<std::unique_ptr<api::EtcdClient>> connect_etcd(const api::ClusterConfig& config);

// Registers `record` in the config's etcd (started_ms and version filled in); nullptr when the
// config names no etcd. A name another live member holds is an error.
Result<std::unique_ptr<ClusterMembership>> join_cluster(const api::ClusterConfig& config,
                                                        api::MemberRecord record);

// Readiness for an orchestrator's probe (Kubernetes): writes `path` once the node serves and,
// with etcd, is registered (a thread waits for that); removed by the destructor, or earlier
// by `withdraw` when the node starts to drain. Empty path: nothing.
class ReadyFile {
  public:
    ReadyFile(std::string path, const ClusterMembership* membership);
    ~ReadyFile();
    void withdraw();

  private:
    const std::string path_;
    std::atomic<bool> stop_{false};
    std::thread thread_;
};

// A stop with a registration: marks the member draining (gateways send it nothing new), waits
// until `busy` says no turn is left or `limit` passes, then deletes the member's key.
void drain_and_leave(ClusterMembership& membership, const std::function<int64_t()>& busy,
                     std::chrono::seconds limit);

}  // namespace deltaserve::cli
