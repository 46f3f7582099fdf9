// deltaserve serve with every batch place taken by turns that generate: a new prompt still
// gets a place in the next forward pass (one is kept for prompts waiting to be prefilled),
// instead of waiting for a long answer to end.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <thread>

#include "cli_runner.h"
#include "http_client.h"
#include "serving.h"
#include "test_paths.h"

namespace deltaserve::testing {
namespace {

using Clock = std::chrono::steady_clock;

TEST(ServeBatchTest, APromptIsNotStarvedByAFullBatchOfLongAnswers) {
    DS_REQUIRE_FILE(default_gguf_model(), "default GGUF model");
    ServingProcess server(serve_args({"--max-batch", "2"}));
    ASSERT_NE(server.port(), 0) << server.log();
    const uint16_t port = server.port();
    Clock::time_point long_done[2];
    int long_tokens[2] = {0, 0};
    std::vector<std::thread> longs;
    for (int i = 0; i < 2; ++i) {
        longs.emplace_back([&, i] {
            const HttpResponse r =
                post_chat(port, chat_body("Count from 1 to 500, separated by commas.", 400));
            long_done[i] = Clock::now();
            if (r.status == 200)
                long_tokens[i] = json::parse(r.body)["usage"]["completion_tokens"].get<int>();
        });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // both generating
    const HttpResponse r = post_chat(port, chat_body("Hello.", 2));
    const Clock::time_point short_done = Clock::now();
    for (auto& t : longs) t.join();
    ASSERT_EQ(r.status, 200) << r.body;
    // (They end at 100-400 tokens, as the batch's numbers fall: long enough to be running.)
    ASSERT_GE(long_tokens[0], 50) << "a long answer ended early: the test shows nothing";
    ASSERT_GE(long_tokens[1], 50) << "a long answer ended early: the test shows nothing";
    EXPECT_LT(short_done, long_done[0]) << "the prompt waited for a long answer to end";
    EXPECT_LT(short_done, long_done[1]) << "the prompt waited for a long answer to end";
}

}  // namespace
}  // namespace deltaserve::testing
