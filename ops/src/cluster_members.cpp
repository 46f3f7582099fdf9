#include "cluster_members.h"

#include <map>

namespace deltaserve::ops {

Result<std::vector<MemberRow>> read_members(const api::ClusterConfig& config) {
    api::EtcdOptions o;
    o.endpoints = config.etcd;
    o.user = config.etcd_user;
    o.password = config.etcd_password;
    DS_ASSIGN_OR_RETURN(auto etcd, api::EtcdClient::create(o));
    DS_ASSIGN_OR_RETURN(api::EtcdRange range, etcd->get_prefix(config.etcd_prefix + "members/"));
    std::vector<MemberRow> rows;
    std::map<int64_t, int64_t> left;  // lease -> seconds
    for (const api::EtcdKeyValue& kv : range.kvs) {
        MemberRow row;
        row.key = kv.key;
        row.lease = kv.lease;
        Result<api::MemberRecord> r = api::parse_member_record(kv.value);
        if (r.ok()) {
            row.record = std::move(*r);
        } else {
            row.error = r.error().message();
        }
        if (kv.lease != 0) {
            auto it = left.find(kv.lease);
            if (it == left.end()) {
                Result<int64_t> ttl = etcd->lease_time_left(kv.lease);
                it = left.emplace(kv.lease, ttl.ok() ? *ttl : -1).first;
            }
            row.ttl_left = it->second;
        }
        rows.push_back(std::move(row));
    }
    return rows;
}

}  // namespace deltaserve::ops
