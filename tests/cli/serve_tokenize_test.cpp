// POST /tokenize and /detokenize through deltaserve serve, as llama-server and vLLM clients
// call them: text and chats to the ids a turn would see (the chat's count is the prompt_tokens
// its completion reports), ids back to the text, and bad input a 400 naming the field.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "http_client.h"
#include "serving.h"
#include "test_paths.h"

namespace deltaserve::testing {
namespace {

class ServeTokenizeTest : public ::testing::Test {
  protected:
    void SetUp() override { DS_REQUIRE_FILE(default_gguf_model(), "default GGUF model"); }
};

HttpResponse post(uint16_t port, const char* path, const json& body) {
    return http_request(port, "POST", path, body.dump());
}

TEST_F(ServeTokenizeTest, TextAndChatsToIdsAndBack) {
    ServingProcess server(serve_args({}));
    ASSERT_NE(server.port(), 0) << server.log();
    const uint16_t port = server.port();
    const std::string text = "Hello, world! Caf\xc3\xa9 \xf0\x9f\x98\x80 <|im_start|>";

    HttpResponse r = post(port, "/tokenize", {{"content", text}});  // llama-server's
    ASSERT_EQ(r.status, 200) << r.body;
    const json t = json::parse(r.body);
    ASSERT_GT(t["tokens"].size(), 3u);
    EXPECT_EQ(t["count"], t["tokens"].size());
    EXPECT_GT(t["max_model_len"].get<int>(), 0);
    r = post(port, "/detokenize", {{"tokens", t["tokens"]}});
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["content"], text);
    EXPECT_EQ(json::parse(r.body)["prompt"], text);  // vLLM's name

    r = post(port, "/tokenize", {{"prompt", text}});  // vLLM's
    ASSERT_EQ(r.status, 200) << r.body;
    r = post(port, "/tokenize", {{"content", text}, {"with_pieces", true}});
    ASSERT_EQ(r.status, 200) << r.body;
    std::string joined;
    const json pieces = json::parse(r.body)["tokens"];
    for (const json& p : pieces) {
        ASSERT_TRUE(p["id"].is_number_integer());
        if (p["piece"].is_string()) {
            joined += p["piece"].get<std::string>();
        } else {
            for (const json& b : p["piece"]) joined += static_cast<char>(b.get<int>());
        }
    }
    EXPECT_EQ(joined, text);

    // A chat: the ids a turn's prompt has.
    const json messages = json::array({{{"role", "system"}, {"content", "Be brief."}},
                                       {{"role", "user"}, {"content", "Name a colour."}}});
    r = post(port, "/tokenize", {{"messages", messages}});
    ASSERT_EQ(r.status, 200) << r.body;
    const int count = json::parse(r.body)["count"];
    json chat = chat_body("", 1);
    chat["messages"] = messages;
    r = post_chat(port, chat);
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["usage"]["prompt_tokens"].get<int>(), count);
    r = post(port, "/tokenize", {{"messages", messages}, {"add_generation_prompt", false}});
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_LT(json::parse(r.body)["count"].get<int>(), count);
    EXPECT_EQ(server.stop(), 0) << server.log();
}

TEST_F(ServeTokenizeTest, BadInputNamesTheField) {
    ServingProcess server(serve_args({}));
    ASSERT_NE(server.port(), 0) << server.log();
    const uint16_t port = server.port();
    const std::pair<const char*, json> cases[] = {
        {"/tokenize", json::object()},
        {"/tokenize", {{"content", 7}}},
        {"/tokenize", {{"content", "x"}, {"add_special", "yes"}}},
        {"/tokenize", {{"messages", json::array({{{"role", "alien"}, {"content", "x"}}})}}},
        {"/detokenize", {{"tokens", {1, -2}}}},
        {"/detokenize", {{"tokens", {1 << 30}}}},
        {"/detokenize", {{"tokens", "1 2"}}},
    };
    for (const auto& [path, body] : cases) {
        const HttpResponse r = post(port, path, body);
        EXPECT_EQ(r.status, 400) << path << " " << body.dump() << " -> " << r.body;
    }
    EXPECT_EQ(http_request(port, "GET", "/tokenize", "").status, 405);
    EXPECT_EQ(server.stop(), 0) << server.log();
}

TEST_F(ServeTokenizeTest, KeysGuardItAsTheApi) {
    ServingProcess server(serve_args({"--api-key", "sk-t"}));
    ASSERT_NE(server.port(), 0) << server.log();
    const std::string body = json{{"content", "hi"}}.dump();
    EXPECT_EQ(http_request(server.port(), "POST", "/tokenize", body).status, 401);
    EXPECT_EQ(
        http_request(server.port(), "POST", "/tokenize", body, "Authorization: Bearer sk-t\r\n")
            .status,
        200);
    EXPECT_EQ(server.stop(), 0) << server.log();
}

}  // namespace
}  // namespace deltaserve::testing
