// Tools through deltaserve serve on the default model: a template that does not render tools
// refuses them saying why (tool_choice none still answers); with Qwen2.5's template (Hermes
// calls) the official openai client's tool-calling loop works unchanged, streaming included
// (tests/api/openai_tools_check.py); a session keeps the call in its history, so its next turn
// sends only the tool's result, finds the rest cached and answers as the whole conversation
// sent again does.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "http_client.h"
#include "serving.h"
#include "test_paths.h"

namespace deltaserve::testing {
namespace {

const json kTools = json::array({{{"type", "function"},
                                  {"function",
                                   {{"name", "get_weather"},
                                    {"description", "Get the current weather in a city"},
                                    {"parameters",
                                     {{"type", "object"},
                                      {"properties", {{"city", {{"type", "string"}}}}},
                                      {"required", {"city"}}}}}}}});

std::string qwen_template() {
    return models_dir() + "/chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja";
}

class ServeToolsTest : public ::testing::Test {
  protected:
    void SetUp() override {
        DS_REQUIRE_FILE(default_gguf_model(), "default GGUF model");
        DS_REQUIRE_FILE(qwen_template(), "the chat template corpus (deploy/setup.sh)");
    }
};

// The conversation of openai_tools_check.py: three earlier calls, then a new question.
json weather_conversation() {
    json m = json::array();
    int n = 0;
    for (const char* city : {"Paris", "London", "Rome", "Berlin"}) {
        m.push_back(
            {{"role", "user"}, {"content", std::string("What is the weather in ") + city + "?"}});
        if (std::string(city) == "Berlin") break;
        const std::string id = "call_" + std::to_string(n++);
        m.push_back(
            {{"role", "assistant"},
             {"content", nullptr},
             {"tool_calls", json::array({{{"id", id},
                                          {"type", "function"},
                                          {"function",
                                           {{"name", "get_weather"},
                                            {"arguments", json{{"city", city}}.dump()}}}}})}});
        m.push_back({{"role", "tool"}, {"tool_call_id", id}, {"content", "{\"temperature\": 18}"}});
        m.push_back(
            {{"role", "assistant"}, {"content", std::string("It is 18 degrees in ") + city + "."}});
    }
    return m;
}

TEST_F(ServeToolsTest, ATemplateWithoutToolsRefusesThemSayingWhy) {
    ServingProcess server(serve_args({}));  // SmolLM2's own template renders no tools
    ASSERT_NE(server.port(), 0) << server.log();
    json body = chat_body("Weather in Paris?", 4);
    body["tools"] = kTools;
    HttpResponse r = post_chat(server.port(), body);
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_NE(r.body.find("does not show tools to the model"), std::string::npos) << r.body;
    body["tool_choice"] = "none";  // tools not shown, nothing to parse: served
    r = post_chat(server.port(), body);
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(server.stop(), 0) << server.log();
}

TEST_F(ServeToolsTest, TheOpenAiClientsToolLoopWorks) {
    DS_REQUIRE_FILE(tools_python(),
                    "Python with the openai client (deploy/setup.sh makes .venv-tools)");
    ServingProcess server(serve_args({"--chat-template", qwen_template(), "--ctx-size", "2048"}));
    ASSERT_NE(server.port(), 0) << server.log();
    const CliResult r = run_binary(tools_python(),
                                   {source_dir() + "/tests/api/openai_tools_check.py", "--port",
                                    std::to_string(server.port())},
                                   "", std::chrono::seconds(600));
    EXPECT_EQ(r.exit_code, 0) << r.describe();
    EXPECT_NE(r.out.find("\"name\": \"get_weather\""), std::string::npos) << r.out;
    EXPECT_EQ(server.stop(), 0) << server.log();
}

TEST_F(ServeToolsTest, ASessionKeepsItsCallsAndSendsOnlyTheResult) {
    ServingProcess server(serve_args({"--chat-template", qwen_template(), "--ctx-size", "2048"}));
    ASSERT_NE(server.port(), 0) << server.log();
    const uint16_t port = server.port();
    ASSERT_EQ(open_session(port, "w"), 200);
    json body = {{"messages", weather_conversation()},
                 {"tools", kTools},
                 {"max_tokens", 48},
                 {"temperature", 0},
                 {"session_id", "w"}};
    HttpResponse r = post_chat(port, body);
    ASSERT_EQ(r.status, 200) << r.body;
    const json first = json::parse(r.body);
    ASSERT_EQ(first["choices"][0]["finish_reason"], "tool_calls") << r.body;
    const json call = first["choices"][0]["message"]["tool_calls"][0];
    const int turn1 = first["usage"]["total_tokens"];

    // Turn 2: only the tool's result.
    const json result = {
        {"role", "tool"}, {"tool_call_id", call["id"]}, {"content", "{\"temperature\": 11}"}};
    body = {{"messages", json::array({result})},
            {"tools", kTools},
            {"max_tokens", 16},
            {"temperature", 0},
            {"session_id", "w"}};
    r = post_chat(port, body);
    ASSERT_EQ(r.status, 200) << r.body;
    const json second = json::parse(r.body);
    EXPECT_GT(second["usage"]["prompt_tokens"].get<int>(), turn1);
    // The template renders the call back as the model wrote it, up to its whitespace: most
    // of the history is cached.
    EXPECT_GT(second["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), turn1 / 2)
        << r.body;

    // The same as the whole conversation sent again, the call as the answer gave it.
    json whole = weather_conversation();
    whole.push_back({{"role", "assistant"},
                     {"content", first["choices"][0]["message"]["content"]},
                     {"tool_calls", first["choices"][0]["message"]["tool_calls"]}});
    whole.push_back(result);
    body = {{"messages", whole}, {"tools", kTools}, {"max_tokens", 16}, {"temperature", 0}};
    r = post_chat(port, body);
    ASSERT_EQ(r.status, 200) << r.body;
    const json again = json::parse(r.body);
    EXPECT_EQ(again["usage"]["prompt_tokens"], second["usage"]["prompt_tokens"]);
    EXPECT_EQ(again["choices"][0]["message"], second["choices"][0]["message"]);
    EXPECT_EQ(server.stop(), 0) << server.log();
}

}  // namespace
}  // namespace deltaserve::testing
