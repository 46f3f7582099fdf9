// The gateway's RPC client to a node (api/rpc_client.h): calls from many threads share one
// connection, also the one made again after the node restarted; a call made while the
// connection is being made waits for it instead of making a second one, which would replace
// the first and break every call already on it.
#include "deltaserve/api/rpc_client.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "default_model.h"
#include "deltaserve/api/cluster_nodes.h"
#include "deltaserve/api/rpc_server.h"
#include "deltaserve/decode/decode_worker.h"
#include "test_paths.h"

namespace deltaserve::api {
namespace {

class RpcClientTest : public ::testing::Test {
  protected:
    static void SetUpTestSuite() { model_ = testing::load_default_model(); }
    static void TearDownTestSuite() {
        delete model_;
        model_ = nullptr;
    }
    void SetUp() override {
        DS_REQUIRE_FILE(testing::default_gguf_model(), "default GGUF model");
        ASSERT_NE(model_, nullptr);
        decode::DecodeOptions d;
        d.context.n_ctx = 256;
        d.threads = 1;
        auto w = decode::DecodeWorker::create(*model_, d);
        ASSERT_TRUE(w.ok()) << w.status().to_string();
        worker_ = std::move(*w);
        roles_.name = "d0";
        roles_.model_id = "test";
        roles_.decode = worker_.get();
        roles_.data_address = "127.0.0.1:1";
    }
    Result<std::unique_ptr<RpcServer>> serve(uint16_t port) {
        return RpcServer::start("127.0.0.1:" + std::to_string(port), roles_);
    }

    static inline model::Model* model_ = nullptr;
    std::unique_ptr<decode::DecodeWorker> worker_;
    NodeRoles roles_;
};

// Threads that call at the same moment; how many calls failed, with the first error.
std::pair<int, std::string> calls_at_once(DecodeNode& node, int threads) {
    std::atomic<int> ready{0}, failed{0};
    std::string first;
    std::mutex mu;
    std::vector<std::thread> ts;
    for (int i = 0; i < threads; ++i) {
        ts.emplace_back([&] {
            ++ready;
            while (ready.load() < threads) std::this_thread::yield();
            auto st = node.stats();
            if (!st.ok()) {
                ++failed;
                std::lock_guard<std::mutex> lock(mu);
                if (first.empty()) first = st.status().to_string();
            }
        });
    }
    for (auto& t : ts) t.join();
    return {failed.load(), first};
}

TEST_F(RpcClientTest, CallsAtOnceAfterTheNodeRestartedAllGoThrough) {
    auto server = serve(0);
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    const uint16_t port = (*server)->port();
    auto client = RpcClient::connect("127.0.0.1:" + std::to_string(port),
                                     std::chrono::milliseconds(5000));
    ASSERT_TRUE(client.ok()) << client.status().to_string();
    auto node = (*client)->decode_node();
    ASSERT_TRUE(node.ok()) << node.status().to_string();
    EXPECT_EQ(calls_at_once(**node, 16).first, 0);

    for (int round = 0; round < 5; ++round) {
        server->reset();  // the node restarts on its address
        server = serve(port);
        ASSERT_TRUE(server.ok()) << server.status().to_string();
        // The client notices the lost connection on its own; calls then connect again.
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        auto [failed, first] = calls_at_once(**node, 16);
        EXPECT_EQ(failed, 0) << "round " << round << ": " << first;
    }
}

// A node that is down fails calls at once (kUnavailable), and serves them again when back.
TEST_F(RpcClientTest, ANodeDownFailsCallsAndServesThemOnceBack) {
    auto server = serve(0);
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    const uint16_t port = (*server)->port();
    auto client = RpcClient::connect("127.0.0.1:" + std::to_string(port),
                                     std::chrono::milliseconds(5000));
    ASSERT_TRUE(client.ok()) << client.status().to_string();
    auto node = (*client)->decode_node();
    ASSERT_TRUE(node.ok()) << node.status().to_string();
    server->reset();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    auto [failed, first] = calls_at_once(**node, 8);
    EXPECT_EQ(failed, 8);
    EXPECT_NE(first.find("UNAVAILABLE"), std::string::npos) << first;
    server = serve(port);
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    EXPECT_EQ(calls_at_once(**node, 8).first, 0);
}

}  // namespace
}  // namespace deltaserve::api
