// The cluster config: nested transport keys, the environment's overrides, unknown keys, the
// device keys.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "deltaserve/api/cluster_config.h"
#include "test_paths.h"

namespace deltaserve::api {
namespace {

class ClusterConfigFile : public ::testing::Test {
  protected:
    void SetUp() override {
        path_ = std::filesystem::temp_directory_path() /
                ("cluster_config_test_" + std::to_string(getpid()) + ".yaml");
        unsetenv("DELTASERVE_TRANSPORT_RNDV_SCHEME");
    }
    void TearDown() override {
        std::filesystem::remove(path_);
        unsetenv("DELTASERVE_TRANSPORT_RNDV_SCHEME");
    }
    Result<ClusterConfig> load(const std::string& yaml) {
        std::ofstream(path_) << yaml;
        return load_cluster_config(path_.string());
    }

    std::filesystem::path path_;
};

constexpr const char* kNodes = R"(
prefill:
  - {name: p0, rpc: "127.0.0.1:7101"}
decode:
  - {name: d0, rpc: "127.0.0.1:7201", data: "127.0.0.1:7202"}
)";

TEST_F(ClusterConfigFile, ReadsTheNestedTransportKeys) {
    auto c =
        load(std::string("model: m.gguf\ntransport:\n  tls: tcp\n  rndv_scheme: am\n") + kNodes);
    ASSERT_TRUE(c.ok()) << c.error().message();
    EXPECT_EQ(c->transport_tls, "tcp");
    EXPECT_EQ(c->transport_rndv_scheme, "am");
}

TEST_F(ClusterConfigFile, TheEnvironmentOverridesTheFile) {
    setenv("DELTASERVE_TRANSPORT_RNDV_SCHEME", "put_zcopy", 1);
    auto c = load(std::string("model: m.gguf\ntransport:\n  rndv_scheme: am\n") + kNodes);
    ASSERT_TRUE(c.ok()) << c.error().message();
    EXPECT_EQ(c->transport_rndv_scheme, "put_zcopy");
}

TEST_F(ClusterConfigFile, EtcdReplacesTheNodeListsAndTheEnvironmentNamesItsEndpoints) {
    auto listed = load(
        "model: m.gguf\netcd: [\"10.0.0.1:2379\", \"http://10.0.0.2:2379\"]\n"
        "member_ttl: 5\ndrain_seconds: 3\netcd_prefix: /ds/prod/\n");
    ASSERT_TRUE(listed.ok()) << listed.error().message();  // no decode node: they join
    EXPECT_EQ(listed->etcd, (std::vector<std::string>{"10.0.0.1:2379", "http://10.0.0.2:2379"}));
    EXPECT_EQ(listed->member_ttl, 5);
    EXPECT_EQ(listed->drain_seconds, 3);
    EXPECT_EQ(listed->etcd_prefix, "/ds/prod/");
    setenv("DELTASERVE_ETCD", "a:1, b:2", 1);
    setenv("DELTASERVE_ETCD_PASSWORD", "pw", 1);
    auto env = load("model: m.gguf\netcd: c:3\netcd_user: root\n");
    unsetenv("DELTASERVE_ETCD");
    unsetenv("DELTASERVE_ETCD_PASSWORD");
    ASSERT_TRUE(env.ok()) << env.error().message();
    EXPECT_EQ(env->etcd, (std::vector<std::string>{"a:1", "b:2"}));
    EXPECT_EQ(env->etcd_password, "pw");
    for (const char* bad : {"etcd: [\"nohost\"]", "etcd: [\"https://h:1\"]", "etcd: [[1]]",
                            "etcd: a:1\netcd_prefix: nope", "etcd: a:1\nmember_ttl: 1",
                            "etcd: a:1\netcd_user: root"}) {
        auto c = load(std::string("model: m.gguf\n") + bad + "\n");
        EXPECT_FALSE(c.ok()) << bad;
    }
    auto none = load("model: m.gguf\n");
    ASSERT_FALSE(none.ok());
    EXPECT_NE(none.error().message().find("no decode node"), std::string::npos);
}

// The configs deploy/ ships (the local cluster's, and Kubernetes' ConfigMap) read as written.
TEST(ShippedClusterConfigs, ParseAsDeltaserveReadsThem) {
    auto local = load_cluster_config(testing::source_dir() + "/deploy/cluster.yaml");
    ASSERT_TRUE(local.ok()) << local.error().message();
    EXPECT_EQ(local->decode.size(), 1u);
    auto k8s = load_cluster_config(testing::source_dir() + "/deploy/k8s/cluster.yaml");
    ASSERT_TRUE(k8s.ok()) << k8s.error().message();
    EXPECT_EQ(k8s->etcd.size(), 3u);
    EXPECT_EQ(k8s->gateway_host, "0.0.0.0");
    EXPECT_TRUE(k8s->decode.empty());
}

TEST_F(ClusterConfigFile, RefusesAnUnknownTransportKeyByName) {
    auto c = load(std::string("model: m.gguf\ntransport:\n  rndv: am\n") + kNodes);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.error().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(c.error().message().find("transport.rndv"), std::string::npos) << c.error().message();
}

TEST_F(ClusterConfigFile, ReadsTheStoredSessionCaps) {
    auto c = load(std::string("model: m.gguf\nmax_stored_sessions: 5\n"
                              "max_stored_sessions_per_tenant: 2\nmax_stored_bytes: 2MiB\n"
                              "max_stored_bytes_per_tenant: 64KiB\n") +
                  kNodes);
    ASSERT_TRUE(c.ok()) << c.error().message();
    EXPECT_EQ(c->max_stored_sessions, 5);
    EXPECT_EQ(c->max_stored_sessions_per_tenant, 2);
    EXPECT_EQ(c->max_stored_bytes, uint64_t{2} << 20);
    EXPECT_EQ(c->max_stored_bytes_per_tenant, uint64_t{64} << 10);
    for (const char* bad : {"max_stored_bytes: 0\n", "max_stored_sessions: 0\n",
                            "max_stored_bytes_per_tenant: lots\n"}) {
        auto r = load(std::string("model: m.gguf\n") + bad + kNodes);
        ASSERT_FALSE(r.ok()) << bad;
        EXPECT_NE(r.error().message().find(std::string(bad).substr(0, 16)), std::string::npos)
            << r.error().message();
    }
}

TEST_F(ClusterConfigFile, ReadsTheDeviceAndItsTier) {
    auto c = load(std::string("model: m.gguf\ndevice: cuda\nkv_device_memory: 2GiB\n") + kNodes);
    ASSERT_TRUE(c.ok()) << c.error().message();
    EXPECT_EQ(c->device, "cuda");
    EXPECT_EQ(c->kv_device_memory, uint64_t{2} << 30);
    auto none = load(std::string("model: m.gguf\n") + kNodes);
    ASSERT_TRUE(none.ok());
    EXPECT_EQ(none->device, "");
    EXPECT_EQ(none->kv_device_memory, 0u);
    auto bad = load(std::string("model: m.gguf\nkv_device_memory: lots\n") + kNodes);
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.error().message().find("kv_device_memory"), std::string::npos)
        << bad.error().message();
}

}  // namespace
}  // namespace deltaserve::api
