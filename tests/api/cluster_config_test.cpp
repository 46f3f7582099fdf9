// The cluster config: nested transport keys, the environment's overrides, and the data
// plane's rendezvous scheme chosen from where the decode nodes are.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "deltaserve/api/cluster_config.h"

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
    EXPECT_EQ(transport_rndv_scheme_for(*c), "am");
}

TEST_F(ClusterConfigFile, TheEnvironmentOverridesTheFile) {
    setenv("DELTASERVE_TRANSPORT_RNDV_SCHEME", "put_zcopy", 1);
    auto c = load(std::string("model: m.gguf\ntransport:\n  rndv_scheme: am\n") + kNodes);
    ASSERT_TRUE(c.ok()) << c.error().message();
    EXPECT_EQ(transport_rndv_scheme_for(*c), "put_zcopy");
}

TEST_F(ClusterConfigFile, RefusesAnUnknownTransportKeyByName) {
    auto c = load(std::string("model: m.gguf\ntransport:\n  rndv: am\n") + kNodes);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.error().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(c.error().message().find("transport.rndv"), std::string::npos) << c.error().message();
}

// Unset, the scheme follows the decode nodes' data addresses: all on loopback means one host
// (a prefill node elsewhere could not reach them), where get_zcopy moves KV through shared
// memory; any other address keeps UCX's own choice, the better one over tcp.
TEST(ClusterConfig, RendezvousSchemeFollowsWhereTheDecodeNodesAre) {
    unsetenv("UCX_TLS");
    ClusterConfig c;
    EXPECT_EQ(transport_rndv_scheme_for(c), "") << "no decode node: nothing to decide on";
    c.decode = {{"d0", "127.0.0.1:7201", "127.0.0.1:7202"}, {"d1", "x:1", "localhost:7302"}};
    EXPECT_EQ(transport_rndv_scheme_for(c), "get_zcopy");
    c.decode.push_back({"d2", "x:2", "[::1]:7402"});
    EXPECT_EQ(transport_rndv_scheme_for(c), "get_zcopy");
    c.transport_tls = "tcp";
    EXPECT_EQ(transport_rndv_scheme_for(c), "") << "tcp alone: no shared memory to pull through";
    c.transport_tls = "sm,tcp";
    EXPECT_EQ(transport_rndv_scheme_for(c), "get_zcopy");
    c.decode.push_back({"d3", "x:3", "10.0.0.7:7502"});
    EXPECT_EQ(transport_rndv_scheme_for(c), "");
    c.transport_rndv_scheme = "auto";
    EXPECT_EQ(transport_rndv_scheme_for(c), "auto");
}

}  // namespace
}  // namespace deltaserve::api
