// The tool-calling fields of the OpenAI protocol: tools and tool_choice read as OpenAI defines
// them, tool calls and tool results in the conversation handed to the template as
// transformers hands them (arguments as objects), what is malformed refused naming the
// field, and answers with calls written as OpenAI writes them, whole and streamed.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "deltaserve/api/openai_protocol.h"

namespace deltaserve::api {
namespace {

using json = nlohmann::ordered_json;

const json kWeatherTool = {
    {"type", "function"},
    {"function",
     {{"name", "get_weather"},
      {"description", "The weather in a city"},
      {"parameters",
       {{"type", "object"},
        {"properties", {{"city", {{"type", "string"}}}, {"unit", {{"enum", {"c", "f"}}}}}},
        {"required", {"city"}}}}}}};

json body_with(json extra) {
    json b = {{"messages", json::array({{{"role", "user"}, {"content", "Weather in Paris?"}}})}};
    for (auto& [k, v] : extra.items()) b[k] = v;
    return b;
}

Result<ChatRequest> parse(const json& body) { return parse_chat_request(body.dump(), {}); }

std::string error_of(const json& body) {
    auto r = parse(body);
    return r.ok() ? "(accepted)" : r.error().message();
}

TEST(OpenAiTools, ToolsReachTheTemplateInTheRequestsKeyOrder) {
    auto r = parse(body_with({{"tools", json::array({kWeatherTool})}}));
    ASSERT_TRUE(r.ok()) << r.error().message();
    EXPECT_TRUE(r->parse_tool_calls);
    EXPECT_TRUE(r->parallel_tool_calls);
    // "type" before "function", "properties" before "required": as the client wrote them,
    // so the model sees what Python's json.dumps would show it.
    EXPECT_EQ(r->tools_json, json::array({kWeatherTool}).dump());
    EXPECT_LT(r->tools_json.find("\"type\""), r->tools_json.find("\"function\""));
}

TEST(OpenAiTools, ToolChoiceNoneHidesTheTools) {
    auto r = parse(body_with({{"tools", json::array({kWeatherTool})}, {"tool_choice", "none"}}));
    ASSERT_TRUE(r.ok()) << r.error().message();
    EXPECT_TRUE(r->tools_json.empty());
    EXPECT_FALSE(r->parse_tool_calls);
    auto a = parse(body_with({{"tools", json::array({kWeatherTool})},
                              {"tool_choice", "auto"},
                              {"parallel_tool_calls", false}}));
    ASSERT_TRUE(a.ok()) << a.error().message();
    EXPECT_TRUE(a->parse_tool_calls);
    EXPECT_FALSE(a->parallel_tool_calls);
    // No tools: nothing to parse, whatever tool_choice auto says.
    auto none = parse(body_with({{"tool_choice", "auto"}}));
    ASSERT_TRUE(none.ok());
    EXPECT_FALSE(none->parse_tool_calls);
}

TEST(OpenAiTools, ForcedCallsAreTakenAndCheckedByName) {
    const json tools = json::array({kWeatherTool});
    auto required = parse(body_with({{"tools", tools}, {"tool_choice", "required"}}));
    ASSERT_TRUE(required.ok()) << required.error().message();
    EXPECT_TRUE(required->force_tool_call);
    EXPECT_TRUE(required->parse_tool_calls);
    EXPECT_EQ(required->forced_tool_name, "");
    const json named = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
    auto one = parse(body_with({{"tools", tools}, {"tool_choice", named}}));
    ASSERT_TRUE(one.ok()) << one.error().message();
    EXPECT_TRUE(one->force_tool_call);
    EXPECT_EQ(one->forced_tool_name, "get_weather");
    EXPECT_NE(error_of(body_with({{"tools", tools},
                                  {"tool_choice", "required"},
                                  {"response_format", {{"type", "json_object"}}}}))
                  .find("cannot force a call and a response_format together"),
              std::string::npos);
    const json other = {{"type", "function"}, {"function", {{"name", "get_time"}}}};
    EXPECT_NE(error_of(body_with({{"tools", tools}, {"tool_choice", other}}))
                  .find("'tool_choice.function.name' names no function of tools"),
              std::string::npos);
    EXPECT_NE(error_of(body_with({{"tool_choice", "required"}})).find("needs tools"),
              std::string::npos);
    EXPECT_NE(error_of(body_with({{"tools", tools}, {"tool_choice", "always"}}))
                  .find("'tool_choice' must be"),
              std::string::npos);
}

TEST(OpenAiTools, MalformedToolsAreRefusedNamingTheField) {
    auto with_tool = [](json tool) { return body_with({{"tools", json::array({tool})}}); };
    json t = kWeatherTool;
    t["type"] = "retrieval";
    EXPECT_NE(error_of(with_tool(t)).find("'tools[0].type' must be \"function\""),
              std::string::npos);
    t = kWeatherTool;
    t["function"]["name"] = "get weather";
    EXPECT_NE(error_of(with_tool(t)).find("'tools[0].function.name' must be 1 to 64"),
              std::string::npos);
    t["function"]["name"] = std::string(65, 'a');
    EXPECT_NE(error_of(with_tool(t)).find("'tools[0].function.name'"), std::string::npos);
    t = kWeatherTool;
    t["function"]["parameters"] = "city";
    EXPECT_NE(error_of(with_tool(t)).find("'tools[0].function.parameters' must be a JSON Schema"),
              std::string::npos);
    t = kWeatherTool;
    t["function"].erase("name");
    EXPECT_NE(error_of(with_tool(t)).find("'tools[0].function.name'"), std::string::npos);
    EXPECT_NE(error_of(body_with({{"tools", json::array({kWeatherTool, kWeatherTool})}}))
                  .find("'tools[1].function.name' names the function 'get_weather' twice"),
              std::string::npos);
    EXPECT_NE(error_of(body_with({{"tools", kWeatherTool}})).find("'tools' must be an array"),
              std::string::npos);
    json many = json::array();
    for (int i = 0; i < 129; ++i) {
        json x = kWeatherTool;
        x["function"]["name"] = "f" + std::to_string(i);
        many.push_back(x);
    }
    EXPECT_NE(error_of(body_with({{"tools", many}})).find("more than 128 tools"),
              std::string::npos);
}

json tool_loop_messages(json arguments) {
    return json::array(
        {{{"role", "user"}, {"content", "Weather in Paris?"}},
         {{"role", "assistant"},
          {"content", nullptr},
          {"tool_calls",
           json::array({{{"id", "call_1"},
                         {"type", "function"},
                         {"function", {{"name", "get_weather"}, {"arguments", arguments}}}}})}},
         {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "18 C, sunny"}}});
}

TEST(OpenAiTools, ACallAndItsResultReachTheTemplateAsTransformersTakesThem) {
    auto r = parse({{"messages", tool_loop_messages("{\"city\": \"Paris\", \"unit\": \"c\"}")},
                    {"tools", json::array({kWeatherTool})}});
    ASSERT_TRUE(r.ok()) << r.error().message();
    ASSERT_EQ(r->messages.size(), 3u);
    EXPECT_TRUE(r->messages[0].json.empty());  // {role, content} alone, as before
    const json assistant = json::parse(r->messages[1].json);
    EXPECT_EQ(r->messages[1].role, "assistant");
    EXPECT_TRUE(assistant["content"].is_null());
    // The arguments string is an object for the template (vLLM and llama.cpp do the same),
    // in the order the client wrote it.
    const json args = assistant["tool_calls"][0]["function"]["arguments"];
    ASSERT_TRUE(args.is_object());
    EXPECT_EQ(args.dump(), R"({"city":"Paris","unit":"c"})");
    EXPECT_EQ(assistant["tool_calls"][0]["id"], "call_1");
    const json tool = json::parse(r->messages[2].json);
    EXPECT_EQ(r->messages[2].role, "tool");
    EXPECT_EQ(r->messages[2].content, "18 C, sunny");
    EXPECT_EQ(tool["tool_call_id"], "call_1");
    EXPECT_EQ(tool["content"], "18 C, sunny");
    // Arguments given as an object are taken as they are.
    auto o = parse({{"messages", tool_loop_messages({{"city", "Oslo"}})}});
    ASSERT_TRUE(o.ok()) << o.error().message();
    EXPECT_EQ(json::parse(o->messages[1].json)["tool_calls"][0]["function"]["arguments"]["city"],
              "Oslo");
}

TEST(OpenAiTools, BrokenCallsInTheConversationAreRefused) {
    EXPECT_NE(error_of({{"messages", tool_loop_messages("{\"city\": ")}})
                  .find("'messages[1].tool_calls[0].function.arguments' is not a JSON object"),
              std::string::npos);
    EXPECT_NE(error_of({{"messages", tool_loop_messages("[1, 2]")}}).find("is not a JSON object"),
              std::string::npos);
    json m = tool_loop_messages("{}");
    m[2].erase("tool_call_id");
    EXPECT_NE(error_of({{"messages", m}}).find("'messages[2].tool_call_id'"), std::string::npos);
    m = tool_loop_messages("{}");
    m[1]["tool_calls"][0].erase("id");
    EXPECT_NE(error_of({{"messages", m}}).find("'messages[1].tool_calls[0].id'"),
              std::string::npos);
    m = tool_loop_messages("{}");
    m[1]["tool_calls"][0]["function"].erase("name");
    EXPECT_NE(error_of({{"messages", m}}).find("'messages[1].tool_calls[0].function.name'"),
              std::string::npos);
    m = tool_loop_messages("{}");
    m[0]["tool_calls"] = m[1]["tool_calls"];
    EXPECT_NE(error_of({{"messages", m}}).find("'messages[0].tool_calls' is only for an assistant"),
              std::string::npos);
    m = tool_loop_messages("{}");
    m[1]["tool_calls"][0]["type"] = "code";
    EXPECT_NE(error_of({{"messages", m}}).find("'messages[1].tool_calls[0].type'"),
              std::string::npos);
    // Deeply nested arguments inside the string are held to the body's own limits.
    std::string deep(40, '[');
    EXPECT_NE(error_of({{"messages", tool_loop_messages("{\"a\": " + deep + "}")}})
                  .find("is not a JSON object"),
              std::string::npos);
    EXPECT_NE(error_of({{"messages", json::array({{{"role", "function"}, {"content", "x"}}})}})
                  .find("'messages[0].role'"),
              std::string::npos);
}

TEST(OpenAiTools, AnAnswerWithCallsIsWrittenAsOpenAiWritesIt) {
    model::ToolCall call{"get_weather", R"({"city":"Paris"})", "call_abc"};
    const json a =
        json::parse(completion_json("id1", 7, "m", "", "tool_calls", {}, "", {}, {call}));
    const json& msg = a["choices"][0]["message"];
    EXPECT_TRUE(msg["content"].is_null());
    EXPECT_EQ(a["choices"][0]["finish_reason"], "tool_calls");
    ASSERT_EQ(msg["tool_calls"].size(), 1u);
    EXPECT_EQ(msg["tool_calls"][0]["id"], "call_abc");
    EXPECT_EQ(msg["tool_calls"][0]["type"], "function");
    EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
    EXPECT_EQ(msg["tool_calls"][0]["function"]["arguments"], R"({"city":"Paris"})");
    // Text beside calls stays content; no calls, no tool_calls key.
    const json b =
        json::parse(completion_json("id1", 7, "m", "Checking.", "tool_calls", {}, "", {}, {call}));
    EXPECT_EQ(b["choices"][0]["message"]["content"], "Checking.");
    const json c = json::parse(completion_json("id1", 7, "m", "", "stop", {}, ""));
    EXPECT_EQ(c["choices"][0]["message"]["content"], "");
    EXPECT_FALSE(c["choices"][0]["message"].contains("tool_calls"));

    const json head = json::parse(tool_call_chunk_json("id1", 7, "m", 1, call, 0, true));
    const json& d0 = head["choices"][0]["delta"];
    EXPECT_EQ(d0["role"], "assistant");
    EXPECT_EQ(d0["tool_calls"][0]["index"], 1);
    EXPECT_EQ(d0["tool_calls"][0]["id"], "call_abc");
    EXPECT_EQ(d0["tool_calls"][0]["function"]["name"], "get_weather");
    EXPECT_EQ(d0["tool_calls"][0]["function"]["arguments"], "");
    const json args = json::parse(tool_call_chunk_json("id1", 7, "m", 1, call, 1, false));
    const json& d1 = args["choices"][0]["delta"];
    EXPECT_FALSE(d1.contains("role"));
    EXPECT_FALSE(d1["tool_calls"][0].contains("id"));
    EXPECT_EQ(d1["tool_calls"][0]["function"]["arguments"], R"({"city":"Paris"})");
    EXPECT_TRUE(args["choices"][0]["finish_reason"].is_null());
}

}  // namespace
}  // namespace deltaserve::api
