// Membership on real etcd (tests/support/etcd_members.h): records checked as a peer's bytes,
// a member seen within a second of registering and gone within its lease's TTL of dying,
// names held by one member, registrations that outlive etcd being away.
#include "deltaserve/api/membership.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>

#include "etcd_members.h"

namespace deltaserve::testing {
namespace {

using namespace api;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr char kPrefix[] = "/deltaserve/test/";

MemberRecord decode_record(const std::string& name, uint16_t port) {
    MemberRecord r;
    r.role = MemberRole::kDecode;
    r.name = name;
    r.rpc = "127.0.0.1:" + std::to_string(port);
    r.data = "127.0.0.1:" + std::to_string(port + 1);
    r.model = "SmolLM2-135M-Instruct.Q4_1.gguf";
    r.kv = "full";
    r.version = "0.1.0";
    r.capacity = 32;
    r.started_ms = 1764806400000;
    return r;
}

std::unique_ptr<EtcdClient> client_of(const EtcdMembers& etcd) {
    EtcdOptions o;
    o.endpoints = etcd.endpoints();
    o.timeout = 1000ms;
    return std::move(*EtcdClient::create(o));
}

// The changes a table reported, waited on.
class Changes {
  public:
    std::function<void(const MemberChange&)> callback() {
        return [this](const MemberChange& c) {
            std::lock_guard<std::mutex> lock(mu_);
            seen_.push_back(c);
            cv_.notify_all();
        };
    }
    // Waits for a change of `kind` to member `name`; its time, or nullopt after `limit`.
    std::optional<MemberChange> wait(MemberChange::Kind kind, const std::string& name,
                                     std::chrono::milliseconds limit = 5000ms) {
        std::unique_lock<std::mutex> lock(mu_);
        std::optional<MemberChange> found;
        cv_.wait_for(lock, limit, [&] {
            for (size_t i = 0; i < seen_.size(); ++i) {
                if (seen_[i].kind == kind && seen_[i].member.record.name == name) {
                    found = seen_[i];
                    seen_.erase(seen_.begin() + static_cast<std::ptrdiff_t>(i));
                    return true;
                }
            }
            return false;
        });
        return found;
    }

  private:
    std::mutex mu_;
    std::condition_variable cv_;
    std::vector<MemberChange> seen_;
};

TEST(MembershipTest, RecordsRoundTripAndWhatIsNotARecordIsRefusedByField) {
    MemberRecord r = decode_record("d0", 7201);
    r.draining = true;
    EXPECT_EQ(parse_member_record(encode_member_record(r)).value(), r);
    MemberRecord g;
    g.role = MemberRole::kGateway;
    g.name = "gw-1";
    g.rpc = "10.0.0.1:9000";
    g.http = "10.0.0.1:8000";
    EXPECT_EQ(parse_member_record(encode_member_record(g)).value(), g);
    g.rpc.clear();  // a gateway without a chat RPC service
    EXPECT_EQ(parse_member_record(encode_member_record(g)).value(), g);
    EXPECT_EQ(member_key(kPrefix, MemberRole::kPrefill, "p0"),
              "/deltaserve/test/members/prefill/p0");

    const std::pair<const char*, const char*> bad[] = {
        {"", "JSON"},
        {"[]", "JSON object"},
        {R"({"role":"router","name":"a","rpc":"h:1"})", "'role'"},
        {R"({"role":"prefill","name":"../x","rpc":"h:1"})", "'name'"},
        {R"({"role":"prefill","name":"","rpc":"h:1"})", "'name'"},
        {R"({"role":"prefill","name":"p","rpc":"h"})", "'rpc'"},
        {R"({"role":"prefill","name":"p"})", "'rpc'"},
        {R"({"role":"decode","name":"d","rpc":"h:1"})", "'data'"},
        {R"({"role":"prefill","name":"p","rpc":"h:1","capacity":-1})", "'capacity'"},
        {R"({"role":"prefill","name":"p","rpc":"h:1","capacity":1.5})", "'capacity'"},
        {R"({"role":"prefill","name":"p","rpc":"h:1","draining":"yes"})", "'draining'"},
        {R"({"role":"prefill","name":"p","rpc":5})", "'rpc'"},
    };
    for (const auto& [value, named] : bad) {
        Result<MemberRecord> p = parse_member_record(value);
        ASSERT_FALSE(p.ok()) << value;
        EXPECT_NE(p.error().message().find(named), std::string::npos) << p.error().message();
    }
    EXPECT_FALSE(parse_member_record(std::string(20000, ' ')).ok());
}

TEST(MembershipTest, AMemberIsUsedWithinASecondAndDroppedWithinItsTtl) {
    REQUIRE_ETCD();
    EtcdMembers etcd(1);
    ASSERT_TRUE(etcd.ready()) << etcd.log(0);
    auto c = client_of(etcd);
    Changes changes;
    MemberTable table(*c, kPrefix, changes.callback());

    const auto t0 = Clock::now();
    auto d0 = Registration::start(*c, kPrefix, decode_record("d0", 7201), 2);
    ASSERT_TRUE(d0.ok()) << d0.error().message();
    EXPECT_TRUE((*d0)->registered());
    auto added = changes.wait(MemberChange::kAdded, "d0");
    ASSERT_TRUE(added);
    const double seen_s = std::chrono::duration<double>(Clock::now() - t0).count();
    EXPECT_LT(seen_s, 1.0);
    EXPECT_EQ(added->member.record, decode_record("d0", 7201));
    EXPECT_EQ(added->member.lease, (*d0)->lease());
    EXPECT_EQ(table.members(MemberRole::kDecode).size(), 1u);
    EXPECT_TRUE(table.members(MemberRole::kPrefill).empty());

    // Renewed past its TTL.
    std::this_thread::sleep_for(3s);
    EXPECT_EQ(table.members().size(), 1u);
    EXPECT_EQ((*d0)->registrations(), 1);

    // Dies (no more keep-alives, as kill -9): gone within the TTL, give or take a second.
    (*d0)->abandon();
    const auto died = Clock::now();
    ASSERT_TRUE(changes.wait(MemberChange::kRemoved, "d0", 6000ms));
    const double gone_s = std::chrono::duration<double>(Clock::now() - died).count();
    EXPECT_LT(gone_s, 3.0);
    EXPECT_TRUE(table.members().empty());

    // Stopped cleanly: gone at once.
    auto d1 = Registration::start(*c, kPrefix, decode_record("d1", 7211), 10);
    ASSERT_TRUE(changes.wait(MemberChange::kAdded, "d1"));
    const auto stopped = Clock::now();
    d1->reset();
    ASSERT_TRUE(changes.wait(MemberChange::kRemoved, "d1", 2000ms));
    const double stop_s = std::chrono::duration<double>(Clock::now() - stopped).count();
    std::printf(
        "a member registered was seen in %.3f s; after its death it went in %.2f s (TTL 2 s); "
        "stopped, in %.3f s\n",
        seen_s, gone_s, stop_s);
}

TEST(MembershipTest, ANameIsOneMembersAndARestartTakesItsOwnBack) {
    REQUIRE_ETCD();
    EtcdMembers etcd(1);
    ASSERT_TRUE(etcd.ready()) << etcd.log(0);
    auto c = client_of(etcd);
    auto first = Registration::start(*c, kPrefix, decode_record("d0", 7201), 10);
    ASSERT_TRUE(first.ok());
    auto other = Registration::start(*c, kPrefix, decode_record("d0", 7301), 10);
    ASSERT_FALSE(other.ok());
    EXPECT_EQ(other.status().code(), StatusCode::kAlreadyExists);
    EXPECT_NE(other.status().message().find("127.0.0.1:7201"), std::string::npos);
    // The same member (same address) after a kill -9, its old lease still alive: it takes over.
    (*first)->abandon();
    auto again = Registration::start(*c, kPrefix, decode_record("d0", 7201), 10);
    ASSERT_TRUE(again.ok()) << again.status().message();
    EXPECT_NE((*again)->lease(), (*first)->lease());
    EXPECT_EQ(c->get((*again)->key())->kvs.at(0).lease, (*again)->lease());
    EXPECT_EQ(Registration::start(*c, kPrefix, decode_record("bad name", 1), 10).status().code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(Registration::start(*c, kPrefix, decode_record("d2", 7401), 1).status().code(),
              StatusCode::kInvalidArgument);
}

TEST(MembershipTest, ARegistrationOutlivesEtcdBeingAway) {
    REQUIRE_ETCD();
    EtcdMembers etcd(1);
    ASSERT_TRUE(etcd.ready()) << etcd.log(0);
    auto c = client_of(etcd);
    auto d0 = Registration::start(*c, kPrefix, decode_record("d0", 7201), 2);
    ASSERT_TRUE(d0.ok());
    etcd.kill(0);
    std::this_thread::sleep_for(4s);  // twice the TTL
    EXPECT_FALSE((*d0)->registered());
    // A member that starts while etcd is away is returned, unregistered, and keeps trying.
    auto d1 = Registration::start(*c, kPrefix, decode_record("d1", 7211), 2);
    ASSERT_TRUE(d1.ok()) << d1.status().message();
    EXPECT_FALSE((*d1)->registered());
    ASSERT_TRUE(etcd.restart(0)) << etcd.log(0);
    const auto back = Clock::now();
    while ((!(*d0)->registered() || !(*d1)->registered()) && Clock::now() - back < 10s) {
        std::this_thread::sleep_for(50ms);
    }
    EXPECT_TRUE((*d0)->registered());
    EXPECT_TRUE((*d1)->registered());
    // And it stays registered: both keys there under their live leases after another TTL.
    std::this_thread::sleep_for(3s);
    auto keys = c->get_prefix(std::string(kPrefix) + "members/");
    ASSERT_TRUE(keys.ok());
    ASSERT_EQ(keys->kvs.size(), 2u);
    EXPECT_EQ(keys->kvs[0].lease, (*d0)->lease());
    EXPECT_EQ(keys->kvs[1].lease, (*d1)->lease());
    std::printf(
        "after etcd came back, both members were registered in %.2f s (d0 under lease #%lld)\n",
        std::chrono::duration<double>(Clock::now() - back).count() - 3.0,
        static_cast<long long>((*d0)->registrations()));
}

TEST(MembershipTest, ValuesThatAreNotRecordsAreLeftOutAndChangesAreSeenByValue) {
    REQUIRE_ETCD();
    EtcdMembers etcd(1);
    ASSERT_TRUE(etcd.ready()) << etcd.log(0);
    auto c = client_of(etcd);
    const std::string members = std::string(kPrefix) + "members/";
    ASSERT_TRUE(c->put(members + "decode/x", "{not json").ok());
    // A valid record under another member's key cannot pose as that member.
    ASSERT_TRUE(
        c->put(members + "decode/d9", encode_member_record(decode_record("d8", 7801))).ok());
    Changes changes;
    MemberTable table(*c, kPrefix, changes.callback());
    auto d0 = Registration::start(*c, kPrefix, decode_record("d0", 7201), 10);
    ASSERT_TRUE(changes.wait(MemberChange::kAdded, "d0"));
    EXPECT_EQ(table.members().size(), 1u);
    EXPECT_EQ(table.rejected(), 2);
    // Draining, then at a new address: each a kChanged.
    MemberRecord r = decode_record("d0", 7201);
    r.draining = true;
    ASSERT_TRUE((*d0)->update(r).ok());
    auto drained = changes.wait(MemberChange::kChanged, "d0");
    ASSERT_TRUE(drained);
    EXPECT_TRUE(drained->member.record.draining);
    r.rpc = "127.0.0.1:7501";
    ASSERT_TRUE((*d0)->update(r).ok());
    auto moved = changes.wait(MemberChange::kChanged, "d0");
    ASSERT_TRUE(moved);
    EXPECT_EQ(moved->member.record.rpc, "127.0.0.1:7501");
    // A record overwritten with garbage is no longer used.
    ASSERT_TRUE(c->put((*d0)->key(), "garbage", (*d0)->lease()).ok());
    EXPECT_TRUE(changes.wait(MemberChange::kRemoved, "d0"));
    EXPECT_TRUE(table.members().empty());
    EXPECT_TRUE(table.synced());
    EXPECT_TRUE(table.connected());
}

}  // namespace
}  // namespace deltaserve::testing
