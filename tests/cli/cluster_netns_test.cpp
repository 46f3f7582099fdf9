// A local cluster whose decode and prefill nodes are separate hosts: network namespaces
// joined by veth pairs on a bridge, so RPC and UCX go over real interfaces, not loopback.
// Its own executable, run alone (RUN_SERIAL, tests/CMakeLists.txt): the bridge and veths it
// adds to this host's namespace while it runs are interfaces that the UCX of any other test's
// processes, started meanwhile, may pick, and lose when they are removed.
#include <gtest/gtest.h>

#include "local_cluster.h"
#include "serving.h"

namespace deltaserve::testing {
namespace {

class ClusterTest : public ::testing::Test {
  protected:
    void SetUp() override { DS_REQUIRE_FILE(default_gguf_model(), "default GGUF model"); }
};

// The same answers as serve, and sessions continue.
TEST_F(ClusterTest, NodesInSeparateNetworkNamespacesAnswerTheSame) {
    Namespaces hosts;
    if (!hosts.available())
        GTEST_SKIP() << "cannot make network namespaces here (needs root and iproute2)";
    Cluster cluster(&hosts);
    ASSERT_TRUE(cluster.up()) << cluster.logs();
    ServingProcess serve(serve_args({"--ctx-size", "2048"}));
    ASSERT_NE(serve.port(), 0) << serve.log();
    const char* q = "What is the capital of France?";
    const HttpResponse a = post_chat(cluster.port(), chat_body(q, 16));
    const HttpResponse b = post_chat(serve.port(), chat_body(q, 16));
    ASSERT_EQ(a.status, 200) << a.body;
    EXPECT_EQ(json::parse(a.body)["choices"][0]["message"]["content"],
              json::parse(b.body)["choices"][0]["message"]["content"]);
    ASSERT_EQ(open_session(cluster.port(), "ada"), 200);
    HttpResponse r =
        post_chat(cluster.port(), chat_body("My name is Ada.", 8), "X-Session-ID: ada\r\n");
    ASSERT_EQ(r.status, 200) << r.body;
    r = post_chat(cluster.port(), chat_body("What is my name?", 8), "X-Session-ID: ada\r\n");
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_GT(json::parse(r.body)["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(),
              10);
    EXPECT_GT(cluster.metric("deltaserve_kv_bytes_shipped_total"), 0);
}

}  // namespace
}  // namespace deltaserve::testing
