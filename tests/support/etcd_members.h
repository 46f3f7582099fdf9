// Real etcd members for tests: Debian's /usr/bin/etcd (deploy/setup.sh installs etcd-server),
// one or three on free loopback ports with their data in a temporary folder, killed with
// SIGKILL and started again on the same data as the tests need. Tests skip with a message
// where etcd is absent.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "http_client.h"
#include "local_cluster.h"

namespace deltaserve::testing {

inline std::string etcd_binary() {
    for (const char* p : {"/usr/bin/etcd", "/usr/local/bin/etcd"}) {
        if (std::filesystem::exists(p)) return p;
    }
    return "";
}

// The first line of a test that needs etcd.
#define REQUIRE_ETCD()                                \
    if (::deltaserve::testing::etcd_binary().empty()) \
    GTEST_SKIP() << "etcd is not installed: run deploy/setup.sh"

class EtcdMembers {
  public:
    // `n` members (1 or 3) and more flags for each (e.g. {"--auth-token-ttl", "1"}).
    explicit EtcdMembers(int n, std::vector<std::string> more = {}) : more_(std::move(more)) {
        if (etcd_binary().empty()) return;
        char tmpl[] = "/tmp/ds-etcd-XXXXXX";
        if (!mkdtemp(tmpl)) return;
        dir_ = tmpl;
        for (int i = 0; i < n; ++i) members_.push_back({free_port(), free_port(), -1});
        for (int i = 0; i < n; ++i) start(i, "new");
        ready_ = wait_healthy();
    }
    ~EtcdMembers() {
        for (size_t i = 0; i < members_.size(); ++i) kill(static_cast<int>(i));
        if (!dir_.empty()) std::filesystem::remove_all(dir_);
    }
    EtcdMembers(const EtcdMembers&) = delete;
    EtcdMembers& operator=(const EtcdMembers&) = delete;

    // Every member answers /health with true.
    bool ready() const { return ready_; }
    int size() const { return static_cast<int>(members_.size()); }
    std::string endpoint(int i) const {
        return "127.0.0.1:" + std::to_string(members_[static_cast<size_t>(i)].client);
    }
    std::vector<std::string> endpoints() const {
        std::vector<std::string> e;
        for (int i = 0; i < size(); ++i) e.push_back(endpoint(i));
        return e;
    }
    uint16_t client_port(int i) const { return members_[static_cast<size_t>(i)].client; }
    std::string log(int i) const {
        std::ifstream f(dir_ + "/m" + std::to_string(i) + ".log");
        return std::string(std::istreambuf_iterator<char>(f), {});
    }

    // kill -9, and waited for.
    void kill(int i) {
        Member& m = members_[static_cast<size_t>(i)];
        if (m.pid <= 0) return;
        ::kill(m.pid, SIGKILL);
        int st = 0;
        waitpid(m.pid, &st, 0);
        m.pid = -1;
    }
    // Starts a killed member again on its data; true once it is healthy.
    bool restart(int i) {
        start(i, "existing");
        return wait_healthy();
    }
    // The member that leads now (-1: none answers).
    int leader() const {
        for (int i = 0; i < size(); ++i) {
            if (members_[static_cast<size_t>(i)].pid <= 0) continue;
            const HttpResponse r =
                http_request(client_port(i), "POST", "/v3/maintenance/status", "{}");
            if (r.status != 200) continue;
            const auto j = nlohmann::json::parse(r.body, nullptr, false);
            if (!j.is_object() || !j.contains("leader") || !j.contains("header")) continue;
            if (j["leader"] == j["header"]["member_id"]) return i;
        }
        return -1;
    }
    // etcdctl against member 0 (user "root:pw" as --user when given); true when it exits 0.
    bool etcdctl(const std::string& args, const std::string& user = "") const {
        std::string cmd = "ETCDCTL_API=3 etcdctl --endpoints " + endpoint(0);
        if (!user.empty()) cmd += " --user " + user;
        return sh(cmd + " " + args);
    }

  private:
    struct Member {
        uint16_t client;
        uint16_t peer;
        pid_t pid;
    };

    void start(int i, const char* state) {
        Member& m = members_[static_cast<size_t>(i)];
        std::string cluster;
        for (int k = 0; k < size(); ++k) {
            if (k) cluster += ",";
            cluster += "m" + std::to_string(k) +
                       "=http://127.0.0.1:" + std::to_string(members_[static_cast<size_t>(k)].peer);
        }
        const std::string client = "http://127.0.0.1:" + std::to_string(m.client);
        const std::string peer = "http://127.0.0.1:" + std::to_string(m.peer);
        std::vector<std::string> args = {etcd_binary(),
                                         "--name",
                                         "m" + std::to_string(i),
                                         "--data-dir",
                                         dir_ + "/m" + std::to_string(i),
                                         "--listen-client-urls",
                                         client,
                                         "--advertise-client-urls",
                                         client,
                                         "--listen-peer-urls",
                                         peer,
                                         "--initial-advertise-peer-urls",
                                         peer,
                                         "--initial-cluster",
                                         cluster,
                                         "--initial-cluster-state",
                                         state,
                                         "--initial-cluster-token",
                                         dir_,
                                         "--heartbeat-interval",
                                         "50",
                                         "--election-timeout",
                                         "500",
                                         "--logger",
                                         "zap",
                                         "--log-level",
                                         "warn"};
        args.insert(args.end(), more_.begin(), more_.end());
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        posix_spawn_file_actions_t actions;
        posix_spawn_file_actions_init(&actions);
        const std::string log = dir_ + "/m" + std::to_string(i) + ".log";
        posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
        posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, log.c_str(),
                                         O_WRONLY | O_CREAT | O_APPEND, 0644);
        pid_t pid = -1;
        if (posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ) == 0) m.pid = pid;
        posix_spawn_file_actions_destroy(&actions);
    }

    bool wait_healthy() const {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        while (std::chrono::steady_clock::now() < deadline) {
            bool all = true;
            for (int i = 0; i < size() && all; ++i) {
                if (members_[static_cast<size_t>(i)].pid <= 0) continue;
                const HttpResponse r = http_request(client_port(i), "GET", "/health");
                all = r.status == 200 && r.body.find("\"true\"") != std::string::npos;
            }
            if (all) return true;
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        return false;
    }

    std::vector<std::string> more_;
    std::string dir_;
    std::vector<Member> members_;
    bool ready_ = false;
};

}  // namespace deltaserve::testing
