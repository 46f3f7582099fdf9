// What etcd says of a cluster's members (api/membership.h), for deltactl cluster: each
// member's record, its lease and the seconds the lease has left.
#pragma once

#include <string>
#include <vector>

#include "deltaserve/api/cluster_config.h"
#include "deltaserve/api/membership.h"

namespace deltaserve::ops {

struct MemberRow {
    std::string key;
    api::MemberRecord record;
    int64_t lease = 0;
    int64_t ttl_left = -1;  // seconds; -1: the lease is gone (the key goes with it)
    std::string error;      // a value that is not a member record (left out by gateways)
};

// The members under the config's etcd prefix. Errors: etcd's (unreachable, refused).
Result<std::vector<MemberRow>> read_members(const api::ClusterConfig& config);

}  // namespace deltaserve::ops
