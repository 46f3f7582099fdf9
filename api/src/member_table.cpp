#include <spdlog/spdlog.h>

#include "deltaserve/api/membership.h"

namespace deltaserve::api {

MemberTable::MemberTable(EtcdClient& etcd, std::string prefix,
                         std::function<void(const MemberChange&)> on_change)
    : root_(prefix), prefix_(prefix + "members/"), on_change_(std::move(on_change)) {
    watch_ =
        std::make_unique<EtcdWatch>(etcd, prefix_, [this](const EtcdWatchUpdate& u) { apply(u); });
}

MemberTable::~MemberTable() { watch_.reset(); }

bool MemberTable::connected() const { return watch_ && watch_->connected(); }

std::vector<Member> MemberTable::members() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Member> out;
    for (const auto& [key, m] : members_) out.push_back(m);
    return out;
}

std::vector<Member> MemberTable::members(MemberRole role) const {
    std::vector<Member> out;
    for (Member& m : members()) {
        if (m.record.role == role) out.push_back(std::move(m));
    }
    return out;
}

bool MemberTable::read(const EtcdKeyValue& kv, Member& into) {
    Result<MemberRecord> r = parse_member_record(kv.value);
    // The key must be the record's own: a record cannot pose as another member.
    if (r.ok() && kv.key != member_key(root_, r->role, r->name)) {
        r = invalid_argument("member record: stored under another member's key");
    }
    if (!r.ok()) {
        rejected_.fetch_add(1);
        spdlog::warn("etcd: {} left out: {}", kv.key, r.error().message());
        return false;
    }
    into.record = std::move(*r);
    into.lease = kv.lease;
    into.mod_revision = kv.mod_revision;
    return true;
}

void MemberTable::apply(const EtcdWatchUpdate& u) {
    std::vector<MemberChange> changes;
    {
        std::lock_guard<std::mutex> lock(mu_);
        std::map<std::string, Member> next;
        if (u.snapshot) {
            for (const EtcdKeyValue& kv : u.kvs) {
                Member m;
                if (read(kv, m)) next.emplace(kv.key, std::move(m));
            }
        } else {
            next = members_;
            for (const EtcdEvent& e : u.events) {
                Member m;
                if (e.deleted || !read(e.kv, m)) {
                    next.erase(e.kv.key);
                } else {
                    next[e.kv.key] = std::move(m);
                }
            }
        }
        // By value: an address or a draining flag that changed is a change.
        for (const auto& [key, m] : members_) {
            const auto it = next.find(key);
            if (it == next.end()) {
                changes.push_back({MemberChange::kRemoved, m});
            } else if (!(it->second.record == m.record) || it->second.lease != m.lease) {
                changes.push_back({MemberChange::kChanged, it->second});
            }
        }
        for (const auto& [key, m] : next) {
            if (!members_.count(key)) changes.push_back({MemberChange::kAdded, m});
        }
        members_ = std::move(next);
    }
    synced_.store(true);
    if (on_change_) {
        for (const MemberChange& c : changes) on_change_(c);
    }
}

}  // namespace deltaserve::api
