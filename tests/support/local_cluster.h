// A local cluster for tests: a config in a temporary folder and its decode, prefill and
// gateway processes, on loopback or with the nodes in network namespaces of their own.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "serving.h"

namespace deltaserve::testing {

// A TCP port on 127.0.0.1 that was free a moment ago. Taken below the kernel's ephemeral
// range (32768 and up on Linux), where no outgoing connection of another test can land on
// it between this check and the node's bind, from a point that differs per process and call,
// so that tests running side by side try different ports.
inline uint16_t free_port() {
    static std::atomic<uint32_t> calls{0};
    constexpr uint32_t kFirst = 20000, kCount = 12000;
    const uint32_t start =
        static_cast<uint32_t>(getpid()) * 7919u + calls.fetch_add(1) * 131u +
        static_cast<uint32_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    for (uint32_t i = 0; i < kCount; ++i) {
        const auto port = static_cast<uint16_t>(kFirst + (start + i) % kCount);
        const int fd = socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons(port);
        const bool free = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
        close(fd);
        if (free) return port;
    }
    return 0;
}

// Runs a shell command; true when it exits 0.
inline bool sh(const std::string& command) {
    return std::system((command + " >/dev/null 2>&1").c_str()) == 0;
}

// Two network namespaces ("hosts") on a bridge in this one, for the decode and the prefill
// node; made only where this process may (root with iproute2), else available() is false.
class Namespaces {
  public:
    Namespaces() {
        const std::string p = std::to_string(getpid() % 100000);
        subnet_ = "10.213." + std::to_string(getpid() % 250) + ".";
        bridge_ = "dsb" + p;
        for (const char* path : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
            if (file_exists(path)) ip_binary_ = path;
        }
        if (geteuid() != 0 || ip_binary_.empty()) return;
        ok_ = sh("ip link add " + bridge_ + " type bridge") &&
              sh("ip addr add " + subnet_ + "1/24 dev " + bridge_) &&
              sh("ip link set " + bridge_ + " up");
        for (const char* role : {"d", "p"}) {
            const std::string ns = std::string("ds") + role + p,
                              host = "dsv" + std::string(role) + p,
                              inner = "dsn" + std::string(role) + p;
            const std::string ip = subnet_ + (role[0] == 'd' ? "2" : "3");
            ok_ = ok_ && sh("ip netns add " + ns) &&
                  sh("ip link add " + host + " type veth peer name " + inner) &&
                  sh("ip link set " + inner + " netns " + ns) &&
                  sh("ip link set " + host + " master " + bridge_) &&
                  sh("ip link set " + host + " up") &&
                  sh("ip netns exec " + ns + " ip addr add " + ip + "/24 dev " + inner) &&
                  sh("ip netns exec " + ns + " ip link set " + inner + " up") &&
                  sh("ip netns exec " + ns + " ip link set lo up");
            namespaces_.push_back(ns);
        }
    }
    ~Namespaces() {
        for (const std::string& ns : namespaces_) sh("ip netns del " + ns);
        sh("ip link del " + bridge_);
    }
    bool available() const { return ok_; }
    std::string ns(char role) const { return namespaces_[role == 'd' ? 0 : 1]; }
    std::string ip(char role) const { return subnet_ + (role == 'd' ? "2" : "3"); }
    const std::string& ip_binary() const { return ip_binary_; }

  private:
    bool ok_ = false;
    std::string ip_binary_;
    std::string subnet_, bridge_;
    std::vector<std::string> namespaces_;
};

// A cluster config in a temporary folder and its three processes, on loopback or with the
// decode and prefill nodes in network namespaces of their own (the gateway stays here). KV
// goes over UCX's tcp unless tls says otherwise ("": UCX's choice, and on one host the
// transport's shared pool, as deploy/cluster.yaml has it).
class Cluster {
  public:
    explicit Cluster(const Namespaces* hosts = nullptr, int n_prefill = 1,
                     const std::string& tls = "tcp") {
        dir_ =
            std::filesystem::temp_directory_path() /
            ("deltaserve-cluster-" + std::to_string(getpid()) + "-" + std::to_string(counter_++));
        std::filesystem::create_directories(dir_);
        const std::string d_ip = hosts ? hosts->ip('d') : "127.0.0.1",
                          p_ip = hosts ? hosts->ip('p') : "127.0.0.1";
        decode_rpc_ = hosts ? 7201 : free_port();
        decode_data_ = hosts ? 7202 : free_port();
        std::ofstream yaml(config());
        yaml << "model: " << default_gguf_model() << "\n"
             << "threads: 1\nctx_size: 2048\nlocal_prefill_max: 0\n"
             << "cluster_token: cluster-test-secret\n"
             << "data_dir: " << (dir_ / "data").string() << "\n"
             << "admin_key: " << kAdminKey << "\n"
             << "gateway: {rpc: \"127.0.0.1:" << (gateway_rpc_ = free_port()) << "\"}\n"
             << "transport: {tls: \"" << tls << "\"}\nprefill:\n";
        for (int i = 0; i < n_prefill; ++i) {
            yaml << "  - {name: p" << i << ", rpc: \"" << p_ip << ":"
                 << (hosts ? 7101 + i : free_port()) << "\"}\n";
        }
        yaml << "decode:\n  - {name: d0, rpc: \"" << d_ip << ":" << decode_rpc_ << "\", data: \""
             << d_ip << ":" << decode_data_ << "\"}\n";
        yaml.close();
        const auto node = [&](const char* role, const char* name) {
            std::vector<std::string> args = {role, "--config", config(), "--name", name};
            if (!hosts) return std::make_unique<ServingProcess>(args, "serving RPC on");
            args.insert(args.begin(), {"netns", "exec", hosts->ns(role[0]), deltaserve_binary()});
            return std::make_unique<ServingProcess>(args, "serving RPC on", hosts->ip_binary());
        };
        decode_ = node("decode", "d0");
        for (int i = 0; i < n_prefill; ++i)
            prefill_.push_back(node("prefill", ("p" + std::to_string(i)).c_str()));
        gateway_ = std::make_unique<ServingProcess>(
            std::vector<std::string>{"gateway", "--config", config(), "--port", "0"});
    }
    ~Cluster() {
        gateway_.reset();
        prefill_.clear();
        decode_.reset();
        std::filesystem::remove_all(dir_);
    }
    bool up() const {
        for (const auto& p : prefill_) {
            if (!p->ready()) return false;
        }
        return decode_->ready() && gateway_->port() != 0;
    }
    // What each process wrote to stderr: its last `tail` bytes.
    std::string logs(size_t tail = 1 << 20) const {
        const auto last = [tail](const std::string& name, const std::string& log) {
            return "--- " + name + " ---\n" +
                   (log.size() > tail ? log.substr(log.size() - tail) : log);
        };
        std::string all = last("decode", decode_->log());
        for (const auto& p : prefill_) all += last("prefill", p->log());
        return all + last("gateway", gateway_->log());
    }
    std::string config() const { return (dir_ / "cluster.yaml").string(); }
    uint16_t port() const { return gateway_->port(); }
    ServingProcess& decode() { return *decode_; }
    ServingProcess& prefill(size_t i = 0) { return *prefill_[i]; }
    ServingProcess& gateway() { return *gateway_; }
    uint16_t decode_rpc() const { return decode_rpc_; }
    // The gateway's chat and admin RPC (deltactl --server), and the admin key.
    static constexpr const char* kAdminKey = "cluster-admin-secret";
    std::string gateway_rpc() const { return "127.0.0.1:" + std::to_string(gateway_rpc_); }
    std::string data_dir() const { return (dir_ / "data").string(); }
    // Starts the decode node again (after it was killed) on the same addresses; false if it
    // does not come up.
    bool restart_decode() {
        decode_.reset();
        // Its addresses are free at once (the transport binds with SO_REUSEADDR), but the
        // kernel may take a moment to release them from the dead process: try again.
        for (int attempt = 0; attempt < 60; ++attempt) {
            decode_ = std::make_unique<ServingProcess>(
                std::vector<std::string>{"decode", "--config", config(), "--name", "d0"},
                "serving RPC on");
            if (decode_->ready()) {
                restarts_tried_ = attempt + 1;
                return true;
            }
            std::this_thread::sleep_for(std::chrono::seconds(1));
        }
        return false;
    }
    int restarts_tried() const { return restarts_tried_; }
    // Starts another gateway on the same config (after this one was killed); false if it
    // does not come up.
    bool restart_gateway() {
        gateway_.reset();
        gateway_ = std::make_unique<ServingProcess>(
            std::vector<std::string>{"gateway", "--config", config(), "--port", "0"});
        return gateway_->port() != 0;
    }
    uint16_t decode_data() const { return decode_data_; }

    // A metric's value from /metrics.
    double metric(const std::string& name) {
        const HttpResponse r = http_request(port(), "GET", "/metrics");
        const size_t at = r.body.find("\n" + name + " ");
        return at == std::string::npos ? -1 : std::atof(r.body.c_str() + at + name.size() + 2);
    }

  private:
    static inline int counter_ = 0;
    int restarts_tried_ = 0;
    std::filesystem::path dir_;
    uint16_t decode_rpc_ = 0, decode_data_ = 0, gateway_rpc_ = 0;
    std::unique_ptr<ServingProcess> decode_, gateway_;
    std::vector<std::unique_ptr<ServingProcess>> prefill_;
};

}  // namespace deltaserve::testing
