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
    // Serves the node on a free port (port_) and connects a client to it (node_).
    void start_and_connect() {
        auto server = serve(0);
        ASSERT_TRUE(server.ok()) << server.status().to_string();
        server_ = std::move(*server);
        port_ = server_->port();
        auto client = RpcClient::connect("127.0.0.1:" + std::to_string(port_),
                                         std::chrono::milliseconds(5000));
        ASSERT_TRUE(client.ok()) << client.status().to_string();
        client_ = std::move(*client);
        auto node = client_->decode_node();
        ASSERT_TRUE(node.ok()) << node.status().to_string();
        node_ = *node;
    }
    // Stops the node, and with restart, serves it again on its address.
    void restart(bool again = true) {
        server_.reset();
        if (!again) return;
        auto server = serve(port_);
        ASSERT_TRUE(server.ok()) << server.status().to_string();
        server_ = std::move(*server);
    }

    static inline model::Model* model_ = nullptr;
    std::unique_ptr<decode::DecodeWorker> worker_;
    NodeRoles roles_;
    std::unique_ptr<RpcServer> server_;
    uint16_t port_ = 0;
    std::unique_ptr<RpcClient> client_;
    DecodeNode* node_ = nullptr;
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
    ASSERT_NO_FATAL_FAILURE(start_and_connect());
    EXPECT_EQ(calls_at_once(*node_, 16).first, 0);
    for (int round = 0; round < 5; ++round) {
        ASSERT_NO_FATAL_FAILURE(restart());  // the node restarts on its address
        // The client notices the lost connection on its own; calls then connect again.
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        auto [failed, first] = calls_at_once(*node_, 16);
        EXPECT_EQ(failed, 0) << "round " << round << ": " << first;
    }
}

// A node that is down fails calls at once (kUnavailable), and serves them again when back.
TEST_F(RpcClientTest, ANodeDownFailsCallsAndServesThemOnceBack) {
    ASSERT_NO_FATAL_FAILURE(start_and_connect());
    restart(/*again=*/false);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    auto [failed, first] = calls_at_once(*node_, 8);
    EXPECT_EQ(failed, 8);
    EXPECT_NE(first.find("UNAVAILABLE"), std::string::npos) << first;
    ASSERT_NO_FATAL_FAILURE(restart());
    EXPECT_EQ(calls_at_once(*node_, 8).first, 0);
}

}  // namespace
}  // namespace deltaserve::api
