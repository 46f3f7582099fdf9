// EtcdClient against real etcd members (tests/support/etcd_members.h): keys, compare-and-swap,
// leases, watches across a member's death, authentication, and endpoints that are not etcd.
#include "deltaserve/api/etcd_client.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "etcd_members.h"

namespace deltaserve::testing {
namespace {

using api::EtcdClient;
using api::EtcdOptions;
using api::EtcdWatchUpdate;
using namespace std::chrono_literals;

std::unique_ptr<EtcdClient> client_of(const std::vector<std::string>& endpoints,
                                      std::chrono::milliseconds timeout = 2000ms) {
    EtcdOptions o;
    o.endpoints = endpoints;
    o.timeout = timeout;
    auto c = EtcdClient::create(o);
    EXPECT_TRUE(c.ok()) << c.error().message();
    return c.ok() ? std::move(*c) : nullptr;
}

// What a watch has delivered, as the map of keys to values it implies.
class WatchedState {
  public:
    std::function<void(const EtcdWatchUpdate&)> callback() {
        return [this](const EtcdWatchUpdate& u) {
            std::lock_guard<std::mutex> lock(mu_);
            if (u.snapshot) {
                keys_.clear();
                ++snapshots_;
                for (const auto& kv : u.kvs) keys_[kv.key] = kv.value;
            }
            for (const auto& e : u.events) {
                if (e.deleted) {
                    keys_.erase(e.kv.key);
                } else {
                    keys_[e.kv.key] = e.kv.value;
                }
            }
            cv_.notify_all();
        };
    }
    // Waits until `pred(keys)` holds; false after `limit`.
    bool wait(const std::function<bool(const std::map<std::string, std::string>&)>& pred,
              std::chrono::milliseconds limit = 5000ms) {
        std::unique_lock<std::mutex> lock(mu_);
        return cv_.wait_for(lock, limit, [&] { return pred(keys_); });
    }
    int snapshots() {
        std::lock_guard<std::mutex> lock(mu_);
        return snapshots_;
    }

  private:
    std::mutex mu_;
    std::condition_variable cv_;
    std::map<std::string, std::string> keys_;
    int snapshots_ = 0;
};

TEST(EtcdClientTest, KeysValuesAndPrefixesRoundTrip) {
    REQUIRE_ETCD();
    EtcdMembers etcd(1);
    ASSERT_TRUE(etcd.ready()) << etcd.log(0);
    auto c = client_of(etcd.endpoints());
    ASSERT_TRUE(c);
    const std::string binary("v\0\xff\x01 end", 8);
    Result<int64_t> r1 = c->put("/ds/a/1", binary);
    ASSERT_TRUE(r1.ok()) << r1.error().message();
    ASSERT_TRUE(c->put("/ds/a/2", "two").ok());
    ASSERT_TRUE(c->put("/ds/b", "other").ok());
    Result<int64_t> r2 = c->put(std::string("/ds/a/\xff", 7), "last");
    ASSERT_TRUE(r2.ok());
    EXPECT_GT(*r2, *r1);

    auto one = c->get("/ds/a/1");
    ASSERT_TRUE(one.ok()) << one.error().message();
    ASSERT_EQ(one->kvs.size(), 1u);
    EXPECT_EQ(one->kvs[0].value, binary);
    EXPECT_EQ(one->kvs[0].mod_revision, *r1);
    EXPECT_EQ(one->kvs[0].version, 1);
    EXPECT_TRUE(c->get("/ds/none")->kvs.empty());

    auto prefix = c->get_prefix("/ds/a/");
    ASSERT_TRUE(prefix.ok());
    ASSERT_EQ(prefix->kvs.size(), 3u);
    EXPECT_EQ(prefix->kvs[0].key, "/ds/a/1");
    EXPECT_EQ(prefix->kvs[2].key, std::string("/ds/a/\xff", 7));
    EXPECT_EQ(prefix->revision, *r2);

    EXPECT_EQ(*c->erase("/ds/a/2"), 1);
    EXPECT_EQ(*c->erase("/ds/a/2"), 0);
    EXPECT_EQ(*c->erase_prefix("/ds/a/"), 2);
    EXPECT_EQ(c->get_prefix("/ds/")->kvs.size(), 1u);
}

TEST(EtcdClientTest, CompareAndSwapWritesOnlyOverTheRevisionItRead) {
    REQUIRE_ETCD();
    EtcdMembers etcd(1);
    ASSERT_TRUE(etcd.ready()) << etcd.log(0);
    auto c = client_of(etcd.endpoints());
    ASSERT_TRUE(c);
    auto created = c->put_if("/ds/lock", "a", 0);
    ASSERT_TRUE(created.ok()) << created.error().message();
    EXPECT_TRUE(created->done);
    auto again = c->put_if("/ds/lock", "b", 0);
    ASSERT_TRUE(again.ok());
    EXPECT_FALSE(again->done);
    EXPECT_EQ(again->current.value, "a");
    EXPECT_EQ(again->current.mod_revision, created->revision);
    EXPECT_FALSE(c->erase_if("/ds/lock", created->revision - 1)->done);
    EXPECT_TRUE(c->put_if("/ds/lock", "c", created->revision)->done);
    EXPECT_EQ(c->get("/ds/lock")->kvs[0].value, "c");

    // Two threads add 1 to one counter 40 times each by read-then-swap: no update is lost.
    ASSERT_TRUE(c->put("/ds/count", "0").ok());
    std::atomic<int> retries{0};
    const auto add = [&] {
        for (int i = 0; i < 40; ++i) {
            while (true) {
                auto cur = c->get("/ds/count");
                ASSERT_TRUE(cur.ok());
                const int v = std::stoi(cur->kvs[0].value);
                auto s = c->put_if("/ds/count", std::to_string(v + 1), cur->kvs[0].mod_revision);
                ASSERT_TRUE(s.ok());
                if (s->done) break;
                ++retries;
            }
        }
    };
    std::thread t1(add), t2(add);
    t1.join();
    t2.join();
    EXPECT_EQ(c->get("/ds/count")->kvs[0].value, "80") << retries << " retries";
    auto gone = c->erase_if("/ds/count", c->get("/ds/count")->kvs[0].mod_revision);
    EXPECT_TRUE(gone->done);
    EXPECT_TRUE(c->get("/ds/count")->kvs.empty());
}

TEST(EtcdClientTest, ALeaseKeepsItsKeysUntilItExpiresOrIsRevoked) {
    REQUIRE_ETCD();
    EtcdMembers etcd(1);
    ASSERT_TRUE(etcd.ready()) << etcd.log(0);
    auto c = client_of(etcd.endpoints());
    ASSERT_TRUE(c);
    auto lease = c->grant_lease(2);
    ASSERT_TRUE(lease.ok()) << lease.error().message();
    ASSERT_TRUE(c->put("/ds/node/a", "up", *lease).ok());
    EXPECT_EQ(c->get("/ds/node/a")->kvs[0].lease, *lease);
    // Kept alive past twice its TTL.
    for (int i = 0; i < 8; ++i) {
        auto ttl = c->keep_alive(*lease);
        ASSERT_TRUE(ttl.ok()) << ttl.error().message();
        EXPECT_EQ(*ttl, 2);
        std::this_thread::sleep_for(500ms);
    }
    EXPECT_EQ(c->get("/ds/node/a")->kvs.size(), 1u);
    auto left = c->lease_time_left(*lease);
    ASSERT_TRUE(left.ok());
    EXPECT_GE(*left, 0);
    EXPECT_LE(*left, 2);
    // Left alone, it expires with its key.
    const auto start = std::chrono::steady_clock::now();
    while (!c->get("/ds/node/a")->kvs.empty() && std::chrono::steady_clock::now() - start < 10s) {
        std::this_thread::sleep_for(100ms);
    }
    EXPECT_TRUE(c->get("/ds/node/a")->kvs.empty());
    EXPECT_LT(std::chrono::steady_clock::now() - start, 4s);
    EXPECT_EQ(c->keep_alive(*lease).status().code(), StatusCode::kNotFound);
    EXPECT_EQ(c->lease_time_left(*lease).status().code(), StatusCode::kNotFound);

    // Revoked: its keys go at once.
    auto second = c->grant_lease(60);
    ASSERT_TRUE(second.ok());
    ASSERT_TRUE(c->put("/ds/node/b", "up", *second).ok());
    EXPECT_TRUE(c->revoke_lease(*second).ok());
    EXPECT_TRUE(c->get("/ds/node/b")->kvs.empty());
    EXPECT_FALSE(c->revoke_lease(*second).ok());
    EXPECT_EQ(c->grant_lease(0).status().code(), StatusCode::kInvalidArgument);
    // A put under a lease that does not exist is etcd's refusal, by name.
    auto orphan = c->put("/ds/node/c", "up", 12345);
    ASSERT_FALSE(orphan.ok());
    EXPECT_NE(orphan.error().message().find("lease not found"), std::string::npos)
        << orphan.error().message();
}

TEST(EtcdClientTest, AWatchSeesEveryChangeAcrossTheDeathOfItsMember) {
    REQUIRE_ETCD();
    EtcdMembers etcd(3);
    ASSERT_TRUE(etcd.ready()) << etcd.log(0);
    auto c = client_of(etcd.endpoints(), 1000ms);
    ASSERT_TRUE(c);
    ASSERT_TRUE(c->put("/ds/m/before", "1").ok());
    ASSERT_TRUE(c->put("/ds/other", "x").ok());
    WatchedState seen;
    auto w = c->watch_prefix("/ds/m/", seen.callback());
    ASSERT_TRUE(w.ok());
    EXPECT_TRUE(seen.wait([](const auto& k) { return k.count("/ds/m/before") == 1; }));
    for (int i = 0; i < 10; ++i) ASSERT_TRUE(c->put("/ds/m/k" + std::to_string(i), "v").ok());
    ASSERT_TRUE(c->erase("/ds/m/before").ok());
    EXPECT_TRUE(
        seen.wait([](const auto& k) { return k.size() == 10 && !k.count("/ds/m/before"); }));
    EXPECT_EQ((*w)->streams(), 1);

    // The member the watch streams from dies; changes made meanwhile through the others
    // reach the watch once it has moved, none lost, with no second snapshot.
    const size_t watched = c->current_endpoint();
    etcd.kill(static_cast<int>(watched));
    std::vector<std::string> rest;
    for (int i = 0; i < 3; ++i) {
        if (static_cast<size_t>(i) != watched) rest.push_back(etcd.endpoint(i));
    }
    auto writer = client_of(rest, 1000ms);
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 10; ++i) {
        Result<int64_t> r = writer->erase("/ds/m/k" + std::to_string(i));
        for (int tries = 0; !r.ok() && tries < 20; ++tries) {  // an election may be under way
            std::this_thread::sleep_for(100ms);
            r = writer->erase("/ds/m/k" + std::to_string(i));
        }
        ASSERT_TRUE(r.ok()) << r.error().message();
    }
    ASSERT_TRUE(writer->put("/ds/m/after", "2").ok());
    EXPECT_TRUE(
        seen.wait([](const auto& k) { return k.size() == 1 && k.count("/ds/m/after"); }, 15000ms));
    EXPECT_GT((*w)->streams(), 1);
    EXPECT_EQ(seen.snapshots(), 1);
    EXPECT_TRUE((*w)->connected());
    std::printf("the watch saw a change made after its member's death %.2f s after the death\n",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    // Destroyed within its timeout, its thread gone.
    const auto stop = std::chrono::steady_clock::now();
    w->reset();
    EXPECT_LT(std::chrono::steady_clock::now() - stop, 2s);
}

TEST(EtcdClientTest, AWatchWaitsOutAnEtcdThatIsDownAndResumes) {
    REQUIRE_ETCD();
    EtcdMembers etcd(1);
    ASSERT_TRUE(etcd.ready()) << etcd.log(0);
    auto c = client_of(etcd.endpoints(), 500ms);
    ASSERT_TRUE(c);
    WatchedState seen;
    auto w = c->watch_prefix("/ds/", seen.callback());
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(c->put("/ds/x", "1").ok());
    EXPECT_TRUE(seen.wait([](const auto& k) { return k.count("/ds/x") == 1; }));
    etcd.kill(0);
    const auto down = std::chrono::steady_clock::now();
    while ((*w)->connected() && std::chrono::steady_clock::now() - down < 5s) {
        std::this_thread::sleep_for(50ms);
    }
    EXPECT_FALSE((*w)->connected());
    EXPECT_EQ(c->put("/ds/y", "2").status().code(), StatusCode::kUnavailable);
    std::this_thread::sleep_for(1s);
    ASSERT_TRUE(etcd.restart(0)) << etcd.log(0);
    ASSERT_TRUE(c->put("/ds/y", "2").ok());
    EXPECT_TRUE(seen.wait([](const auto& k) { return k.count("/ds/y") == 1; }, 10000ms));
    EXPECT_EQ(seen.snapshots(), 1);
}

TEST(EtcdClientTest, AuthenticationIsUsedAndRenewed) {
    REQUIRE_ETCD();
    // Tokens live 1 s: the client must authenticate again on its own.
    EtcdMembers etcd(1, {"--auth-token", "simple", "--auth-token-ttl", "1"});
    ASSERT_TRUE(etcd.ready()) << etcd.log(0);
    ASSERT_TRUE(etcd.etcdctl("user add root:rootpw"));
    ASSERT_TRUE(etcd.etcdctl("auth enable"));
    ASSERT_TRUE(etcd.etcdctl("put /ds/secret s", "root:rootpw"));

    auto anonymous = client_of(etcd.endpoints());
    auto refused = anonymous->get("/ds/secret");
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.error().message().find("etcd"), std::string::npos);

    EtcdOptions o;
    o.endpoints = etcd.endpoints();
    o.user = "root";
    o.password = "wrong";
    auto bad = (*EtcdClient::create(o))->get("/ds/secret");
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.error().message().find("authentication"), std::string::npos)
        << bad.error().message();

    o.password = "rootpw";
    auto c = std::move(*EtcdClient::create(o));
    ASSERT_EQ(c->get("/ds/secret")->kvs.at(0).value, "s");
    WatchedState seen;
    auto w = c->watch_prefix("/ds/", seen.callback());
    EXPECT_TRUE(seen.wait([](const auto& k) { return k.count("/ds/secret") == 1; }));
    std::this_thread::sleep_for(2500ms);  // the token has expired
    auto later = c->put("/ds/later", "l");
    ASSERT_TRUE(later.ok()) << later.error().message();
    EXPECT_TRUE(seen.wait([](const auto& k) { return k.count("/ds/later") == 1; }, 15000ms));

    EXPECT_FALSE(EtcdClient::create({{"a:1"}, "root", "", 1000ms, 1000ms}).ok());
}

// A socket that accepts and never answers, and one that answers bytes that are not etcd's.
class FakeEndpoint {
  public:
    explicit FakeEndpoint(std::string answer) : answer_(std::move(answer)) {
        fd_ = socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
        socklen_t len = sizeof a;
        getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
        port_ = ntohs(a.sin_port);
        listen(fd_, 8);
        thread_ = std::thread([this] {
            while (true) {
                const int c = accept(fd_, nullptr, nullptr);
                if (c < 0) return;
                char buf[4096];
                (void)!read(c, buf, sizeof buf);
                if (!answer_.empty()) (void)!write(c, answer_.data(), answer_.size());
                held_.push_back(c);
            }
        });
    }
    ~FakeEndpoint() {
        shutdown(fd_, SHUT_RDWR);
        close(fd_);
        thread_.join();
        for (int c : held_) close(c);
    }
    std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }

  private:
    std::string answer_;
    int fd_ = -1;
    uint16_t port_ = 0;
    std::thread thread_;
    std::vector<int> held_;
};

TEST(EtcdClientTest, EndpointsThatAreNotEtcdGiveClearErrorsInTime) {
    for (const char* bad :
         {"nohost", "https://127.0.0.1:2379", "127.0.0.1:0", "127.0.0.1:99999", "a b:1", ""}) {
        auto c = EtcdClient::create({{bad}, "", "", 1000ms, 1000ms});
        EXPECT_FALSE(c.ok()) << bad;
    }
    EXPECT_EQ(EtcdClient::create({{"https://h:1"}, "", "", 1000ms, 1000ms}).status().code(),
              StatusCode::kUnimplemented);

    // Nothing listens.
    auto nobody = client_of({"127.0.0.1:" + std::to_string(free_port())}, 500ms);
    EXPECT_EQ(nobody->get("/k").status().code(), StatusCode::kUnavailable);

    // Silent: the call ends at its deadline.
    FakeEndpoint silent("");
    auto hang = client_of({silent.endpoint()}, 300ms);
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(hang->get("/k").status().code(), StatusCode::kDeadlineExceeded);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);

    // An HTTP server that is not etcd, and JSON that is not etcd's answer.
    FakeEndpoint html("HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nnot here\n");
    auto wrong = client_of({html.endpoint()}, 500ms);
    EXPECT_FALSE(wrong->get("/k").ok());
    FakeEndpoint odd(
        "HTTP/1.1 200 OK\r\nContent-Length: 35\r\n\r\n{\"header\":{},\"kvs\":[{\"key\":\"!!!\"}]}");
    auto oddc = client_of({odd.endpoint()}, 500ms);
    auto r = oddc->get("/k");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message().find("base64"), std::string::npos) << r.error().message();

    // A dead endpoint before a live one: the call goes on to the live one.
    REQUIRE_ETCD();
    EtcdMembers etcd(1);
    ASSERT_TRUE(etcd.ready()) << etcd.log(0);
    auto c = client_of(
        {silent.endpoint(), "127.0.0.1:" + std::to_string(free_port()), etcd.endpoint(0)}, 300ms);
    ASSERT_TRUE(c->put("/k", "v").ok());
    EXPECT_EQ(c->current_endpoint(), 2u);
    EXPECT_EQ(c->get("/k")->kvs.at(0).value, "v");
}

TEST(EtcdClientTest, EndpointListsSplitAsDeltaserveEtcdGivesThem) {
    EXPECT_EQ(api::split_etcd_endpoints("a:1, b:2 ,,c:3"),
              (std::vector<std::string>{"a:1", "b:2", "c:3"}));
    EXPECT_TRUE(api::split_etcd_endpoints(" , ").empty());
}

}  // namespace
}  // namespace deltaserve::testing
