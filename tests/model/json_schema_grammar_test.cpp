// JSON Schema -> grammar: the texts it admits and refuses, byte by byte, and the schemas it
// refuses by name.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "deltaserve/model/grammar_matcher.h"
#include "deltaserve/model/json_schema_grammar.h"

namespace deltaserve::model {
namespace {

std::shared_ptr<const Grammar> compile(const std::string& schema) {
    auto g = json_schema_grammar(schema);
    EXPECT_TRUE(g.ok()) << schema << ": " << g.status().to_string();
    return g.ok() ? *g : nullptr;
}

// The whole text matches.
bool admits(const std::shared_ptr<const Grammar>& g, const std::string& text) {
    GrammarMatcher m(g);
    return m.accept(text) && m.can_end();
}

std::string refusal(const std::string& schema) {
    auto g = json_schema_grammar(schema);
    EXPECT_FALSE(g.ok()) << schema << " compiled";
    return g.ok() ? "" : g.status().message();
}

TEST(JsonSchemaGrammarTest, ObjectPropertiesInOrderRequiredAndOptional) {
    auto g = compile(R"({"type":"object","properties":{"name":{"type":"string"},
        "age":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"}}},
        "required":["name","age"],"additionalProperties":false})");
    ASSERT_NE(g, nullptr);
    EXPECT_TRUE(admits(g, R"({"name":"Ada","age":36})"));
    EXPECT_TRUE(admits(g, R"({"name": "Ada", "age": 36, "tags": ["x", "y"]})"));
    EXPECT_TRUE(admits(g, "{\n  \"name\": \"Ada\",\n  \"age\": -7\n}"));
    EXPECT_FALSE(admits(g, "{\"name\":\"Ada\",\"age\":1}\n"));  // nothing after the value
    EXPECT_FALSE(admits(g, R"({"name":"Ada"})"));               // age is required
    EXPECT_FALSE(admits(g, R"({"age":36,"name":"Ada"})"));      // the schema's order
    EXPECT_FALSE(admits(g, R"({"name":"Ada","age":36.5})"));    // an integer
    EXPECT_FALSE(admits(g, R"({"name":"Ada","age":36,"x":1})"));
    EXPECT_FALSE(admits(g, R"({"name":"Ada","age":36,})"));
    EXPECT_FALSE(admits(g, R"({"name":"Ada","age":036})"));
}

TEST(JsonSchemaGrammarTest, AllOptionalPropertiesAnySubsetInOrder) {
    auto g = compile(R"({"properties":{"a":{"type":"boolean"},"b":{"type":"null"},
        "c":{"type":"number"}}})");
    ASSERT_NE(g, nullptr);
    for (const char* ok : {"{}", R"({"b":null})", R"({"a":true,"c":1.5e-3})",
                           R"({"a":false,"b":null,"c":0})", R"({"c":-0.25E+2})"}) {
        EXPECT_TRUE(admits(g, ok)) << ok;
    }
    EXPECT_FALSE(admits(g, R"({,"b":null})"));
    EXPECT_FALSE(admits(g, R"({"c":1,"a":true})"));
    EXPECT_FALSE(admits(g, R"({"c":1.})"));
}

TEST(JsonSchemaGrammarTest, StringsEscapesAndUtf8) {
    auto g = compile(R"({"type":"string"})");
    ASSERT_NE(g, nullptr);
    EXPECT_TRUE(admits(g, R"("plain")"));
    EXPECT_TRUE(admits(g, R"("a \"quote\" \\ \/ \n \u00e9 \uD83D")") == false);  // lone surrogate
    EXPECT_TRUE(admits(g, R"("a \"quote\" \\ \/ \n \u00e9")"));
    EXPECT_TRUE(admits(g, "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\""));
    EXPECT_FALSE(admits(g, "\"\xc3\""));          // a cut character
    EXPECT_FALSE(admits(g, "\"\xed\xa0\x80\""));  // an encoded surrogate
    EXPECT_FALSE(admits(g, "\"\xc0\xaf\""));      // overlong
    EXPECT_FALSE(admits(g, "\"tab\there\""));     // a raw control character
    EXPECT_FALSE(admits(g, R"("\x")"));
    EXPECT_FALSE(admits(g, R"("open)"));
}

TEST(JsonSchemaGrammarTest, NumbersAreBounded) {
    auto g = compile(R"({"type":"number"})");
    ASSERT_NE(g, nullptr);
    EXPECT_TRUE(admits(g, "1234567890123456"));
    EXPECT_FALSE(admits(g, "12345678901234567"));  // 17 integer digits
    EXPECT_TRUE(admits(g, "0.5"));
    EXPECT_FALSE(admits(g, "-"));
    EXPECT_FALSE(admits(g, "+1"));
    EXPECT_FALSE(admits(g, "1e1234"));
}

TEST(JsonSchemaGrammarTest, EnumConstAnyOfAndTypeLists) {
    auto e = compile(R"({"enum":["red","green",3,null]})");
    ASSERT_NE(e, nullptr);
    EXPECT_TRUE(admits(e, R"("green")"));
    EXPECT_TRUE(admits(e, "null"));
    EXPECT_FALSE(admits(e, R"("blue")"));
    auto typed = compile(R"({"type":"string","enum":["a",1]})");  // 1 is not a string
    ASSERT_NE(typed, nullptr);
    EXPECT_TRUE(admits(typed, R"("a")"));
    EXPECT_FALSE(admits(typed, "1"));
    auto c = compile(R"({"const":{"k":[1,2]}})");
    ASSERT_NE(c, nullptr);
    EXPECT_TRUE(admits(c, R"({"k":[1,2]})"));
    auto any =
        compile(R"({"anyOf":[{"type":"integer"},{"type":"array","items":{"type":"null"}}]})");
    ASSERT_NE(any, nullptr);
    EXPECT_TRUE(admits(any, "12"));
    EXPECT_TRUE(admits(any, "[null, null]"));
    EXPECT_FALSE(admits(any, "\"x\""));
    auto list = compile(R"({"type":["string","null"]})");
    ASSERT_NE(list, nullptr);
    EXPECT_TRUE(admits(list, "null"));
    EXPECT_TRUE(admits(list, "\"s\""));
    EXPECT_FALSE(admits(list, "1"));
}

TEST(JsonSchemaGrammarTest, ArrayBounds) {
    auto g = compile(R"({"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":3})");
    ASSERT_NE(g, nullptr);
    EXPECT_FALSE(admits(g, "[1]"));
    EXPECT_TRUE(admits(g, "[1,2]"));
    EXPECT_TRUE(admits(g, "[1, 2, 3]"));
    EXPECT_FALSE(admits(g, "[1,2,3,4]"));
    EXPECT_FALSE(admits(g, "[]"));
}

TEST(JsonSchemaGrammarTest, RecursionThroughRefs) {
    auto g = compile(R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
        "kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v","kids"],
        "additionalProperties":false}},"$ref":"#/$defs/node"})");
    ASSERT_NE(g, nullptr);
    EXPECT_TRUE(
        admits(g, R"({"v":1,"kids":[{"v":2,"kids":[]},{"v":3,"kids":[{"v":4,"kids":[]}]}]})"));
    EXPECT_FALSE(admits(g, R"({"v":1,"kids":[{"v":2}]})"));
    auto root = compile(R"({"type":"array","items":{"anyOf":[{"type":"integer"},{"$ref":"#"}]}})");
    ASSERT_NE(root, nullptr);
    EXPECT_TRUE(admits(root, "[1,[2,[3]],[]]"));
}

TEST(JsonSchemaGrammarTest, MapsAndFreeObjects) {
    auto map = compile(R"({"type":"object","additionalProperties":{"type":"integer"}})");
    ASSERT_NE(map, nullptr);
    EXPECT_TRUE(admits(map, R"({"x":1,"y z":2})"));
    EXPECT_FALSE(admits(map, R"({"x":"1"})"));
    auto free = compile(R"({"type":"object"})");  // json_object
    ASSERT_NE(free, nullptr);
    EXPECT_TRUE(admits(free, R"({"a":[1,{"b":null}],"c":"d","e":true})"));
    EXPECT_FALSE(admits(free, "[1]"));
    EXPECT_FALSE(admits(free, R"({"a":1} {"b":2})"));
    auto closed = compile(R"({"type":"object","additionalProperties":false})");
    ASSERT_NE(closed, nullptr);
    EXPECT_TRUE(admits(closed, "{}"));
    EXPECT_FALSE(admits(closed, R"({"a":1})"));
}

TEST(JsonSchemaGrammarTest, WhitespaceIsBounded) {
    auto g = compile(R"({"type":"array"})");
    ASSERT_NE(g, nullptr);
    EXPECT_TRUE(admits(g, "[\n" + std::string(20, ' ') + "1\n]"));
    EXPECT_FALSE(admits(g, "[\n" + std::string(21, ' ') + "1]"));
    EXPECT_FALSE(admits(g, "[\n\n1]"));
    EXPECT_FALSE(admits(g, " [1]"));  // the value first
}

TEST(JsonSchemaGrammarTest, RefusesWhatItCannotEnforceByName) {
    const std::pair<const char*, const char*> cases[] = {
        {R"({"type":"string","pattern":"^a+$"})", "'pattern' at /"},
        {R"({"type":"string","format":"date-time"})", "'format'"},
        {R"({"type":"integer","minimum":3})", "'minimum'"},
        {R"({"oneOf":[{"type":"string"}]})", "'oneOf'"},
        {R"({"properties":{"a":{"type":"string","maxLength":3}}})", "'maxLength' at /properties/a"},
        {R"({"type":"strings"})", "'type'"},
        {R"({"enum":[]})", "'enum'"},
        {R"({"required":["x"]})", "required property 'x'"},
        {R"({"$ref":"#/$defs/none"})", "names nothing"},
        {R"({"$ref":"https://example.com/s.json"})", "'$ref'"},
        {R"({"$defs":{"a":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})", "left recursion"},
        {R"({"anyOf":[{"$ref":"#"}]})", "left recursion"},
        {R"({"anyOf":[{"type":"string"}],"type":"string"})", "'anyOf' beside 'type'"},
        {R"({"type":"array","maxItems":100000})", "'maxItems' above"},
        {R"({"type":"array","minItems":3,"maxItems":2})", "below"},
        {"false", "admits no value"},
        {"{\"type\":", "not valid JSON"},
        {"[1]", "must be an object or a boolean"},
    };
    for (const auto& [schema, says] : cases) {
        const std::string why = refusal(schema);
        EXPECT_NE(why.find(says), std::string::npos) << schema << " -> " << why;
    }
    std::string deep;
    for (int i = 0; i < 100000; ++i) deep += "{\"items\":";
    EXPECT_NE(refusal(deep).find("nested deeper"), std::string::npos);
}

TEST(JsonSchemaGrammarTest, AnnotationsChangeNothing) {
    auto g = compile(R"({"title":"T","description":"d","$schema":"x","type":"boolean",
        "default":true,"examples":[false]})");
    ASSERT_NE(g, nullptr);
    EXPECT_TRUE(admits(g, "true"));
    EXPECT_FALSE(admits(g, "1"));
}

TEST(JsonSchemaGrammarTest, ValueBetweenLiterals) {
    // A forced Hermes call: the call's object between its markers.
    auto g = json_schema_grammar(
        R"({"anyOf":[{"type":"object","properties":{"name":{"const":"f"},"arguments":{
        "type":"object"}},"required":["name","arguments"],"additionalProperties":false}]})",
        "<tool_call>\n", "\n</tool_call>");
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    EXPECT_TRUE(admits(*g, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>"));
    EXPECT_FALSE(admits(*g, "{\"name\": \"f\", \"arguments\": {}}"));
    EXPECT_FALSE(admits(*g, "<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>"));
    GrammarMatcher m(*g);
    ASSERT_TRUE(m.accept("<tool_call>\n{\"name\":\"f\",\"arguments\":{}}\n</tool_call>"));
    EXPECT_TRUE(m.must_end());
}

}  // namespace
}  // namespace deltaserve::model
