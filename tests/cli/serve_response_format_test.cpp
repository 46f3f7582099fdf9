// Structured output through deltaserve serve on the default model: response_format
// json_schema and json_object, enforced while decoding, checked by the jsonschema package
// through the official openai client (tests/api/openai_response_format_check.py); what the
// engine cannot enforce is refused with a 400 naming it, never served as free text.
#include <gtest/gtest.h>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "http_client.h"
#include "serving.h"
#include "test_paths.h"

namespace deltaserve::testing {
namespace {

class ServeResponseFormatTest : public ::testing::Test {
  protected:
    void SetUp() override { DS_REQUIRE_FILE(default_gguf_model(), "default GGUF model"); }
};

json with_schema(json schema) {
    return {{"type", "json_schema"},
            {"json_schema", {{"name", "answer"}, {"schema", std::move(schema)}, {"strict", true}}}};
}

TEST_F(ServeResponseFormatTest, TheOpenAiClientsAnswersValidate) {
    DS_REQUIRE_FILE(tools_python(),
                    "Python with openai and jsonschema (deploy/setup.sh makes .venv-tools)");
    ServingProcess server(serve_args({}));
    ASSERT_NE(server.port(), 0) << server.log();
    const CliResult r = run_binary(tools_python(),
                                   {source_dir() + "/tests/api/openai_response_format_check.py",
                                    "--port", std::to_string(server.port()),
                                    // Under a sanitizer one answer a schema is enough.
                                    "--seeds", time_scale() > 1 ? "1" : "3"},
                                   "", std::chrono::seconds(900));
    EXPECT_EQ(r.exit_code, 0) << r.describe();
    EXPECT_NE(r.out.find("\"valid\""), std::string::npos) << r.out;
    std::cout << "answers: " << r.out;
    EXPECT_EQ(server.stop(), 0) << server.log();
}

TEST_F(ServeResponseFormatTest, GreedyAnswersAreWholeValuesThatEndTheTurn) {
    ServingProcess server(serve_args({}));
    ASSERT_NE(server.port(), 0) << server.log();
    json body = chat_body("Is the sky blue? Answer yes or no.", 64);
    body["response_format"] = with_schema({{"enum", {"yes", "no"}}});
    HttpResponse r = post_chat(server.port(), body);
    ASSERT_EQ(r.status, 200) << r.body;
    const json answer = json::parse(r.body);
    const json& choice = answer["choices"][0];
    EXPECT_EQ(choice["finish_reason"], "stop") << r.body;
    const std::string text = choice["message"]["content"];
    EXPECT_TRUE(text == "\"yes\"" || text == "\"no\"") << text;
    // The value is whole after at most a token a character: the turn ends there.
    EXPECT_LE(answer["usage"]["completion_tokens"].get<int>(), 5) << r.body;
    EXPECT_EQ(server.stop(), 0) << server.log();
}

TEST_F(ServeResponseFormatTest, WhatCannotBeEnforcedIsRefusedByName) {
    ServingProcess server(serve_args({}));
    ASSERT_NE(server.port(), 0) << server.log();
    const std::pair<json, const char*> cases[] = {
        {{{"response_format", with_schema({{"type", "string"}, {"format", "email"}})}}, "'format'"},
        {{{"response_format", with_schema({{"type", "integer"}, {"maximum", 9}})}}, "'maximum'"},
        {{{"response_format", {{"type", "json_schema"}}}}, "response_format.json_schema"},
        {{{"response_format", {{"type", "regex"}}}}, "response_format.type"},
        {{{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "bad name!"}}}}}},
         "response_format.json_schema.name"},
        {{{"grammar", "root ::= \"a\""}}, "'grammar'"},
        {{{"guided_regex", "a+"}}, "'guided_regex'"},
        {{{"guided_json", "{not json"}}, "'guided_json'"},
        {{{"response_format", {{"type", "json_object"}}}, {"guided_json", json::object()}},
         "not several"},
    };
    for (const auto& [fields, says] : cases) {
        json body = chat_body("hi", 4);
        body.update(fields);
        const HttpResponse r = post_chat(server.port(), body);
        EXPECT_EQ(r.status, 400) << fields.dump() << " -> " << r.body;
        EXPECT_NE(r.body.find(says), std::string::npos) << fields.dump() << " -> " << r.body;
    }
    // The peers' other spellings are served.
    for (const json& fields :
         {json{{"guided_json", {{"type", "boolean"}}}},
          json{{"json_schema", {{"type", "boolean"}}}},
          json{
              {"response_format", {{"type", "json_object"}, {"schema", {{"type", "boolean"}}}}}}}) {
        json body = chat_body("Is water wet?", 8);
        body.update(fields);
        const HttpResponse r = post_chat(server.port(), body);
        ASSERT_EQ(r.status, 200) << fields.dump() << " -> " << r.body;
        const std::string text = json::parse(r.body)["choices"][0]["message"]["content"];
        EXPECT_TRUE(text.rfind("true", 0) == 0 || text.rfind("false", 0) == 0) << text;
    }
    EXPECT_EQ(server.stop(), 0) << server.log();
}

}  // namespace
}  // namespace deltaserve::testing
