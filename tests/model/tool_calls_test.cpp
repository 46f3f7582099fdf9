// Tool calls in answers: each format's calls found as the models write them, streamed in any
// split, and text that only looks like a call given back as text.
#include "deltaserve/model/tool_calls.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "test_paths.h"

namespace deltaserve::model {
namespace {

struct Parsed {
    std::string content;
    std::vector<ToolCall> calls;
};

// The whole answer in pieces of `step` bytes (0: one piece).
Parsed parse(ToolCallFormat format, std::string_view text, size_t step = 0, bool parallel = true) {
    ToolCallParser p(format, parallel);
    Parsed out;
    auto add = [&](ToolCallParser::Step s) {
        out.content += s.content;
        for (auto& c : s.calls) out.calls.push_back(std::move(c));
    };
    if (step == 0) step = text.size() + 1;
    for (size_t i = 0; i < text.size(); i += step) add(p.feed(text.substr(i, step)));
    add(p.finish());
    return out;
}

// Every split gives what the whole answer gives.
void expect_split_invariant(ToolCallFormat format, std::string_view text) {
    const Parsed whole = parse(format, text);
    for (size_t step : {1, 2, 3, 5, 7, 11}) {
        const Parsed split = parse(format, text, step);
        EXPECT_EQ(split.content, whole.content) << "step " << step;
        ASSERT_EQ(split.calls.size(), whole.calls.size()) << "step " << step;
        for (size_t i = 0; i < whole.calls.size(); ++i) {
            EXPECT_EQ(split.calls[i].name, whole.calls[i].name);
            EXPECT_EQ(split.calls[i].arguments, whole.calls[i].arguments);
        }
    }
}

TEST(ToolCallParser, HermesCallsAfterText) {
    // Qwen2.5-7B-Instruct's answer to a weather question with two cities.
    const std::string text =
        "Let me check both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
        "{\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>\n<tool_call>\n{\"name\": "
        "\"get_weather\", \"arguments\": {\"city\": \"K\xc3\xb8"
        "benhavn\"}}\n</tool_call>";
    const Parsed r = parse(ToolCallFormat::kHermes, text);
    EXPECT_EQ(r.content, "Let me check both.");
    ASSERT_EQ(r.calls.size(), 2u);
    EXPECT_EQ(r.calls[0].name, "get_weather");
    EXPECT_EQ(r.calls[0].arguments, R"({"city":"Paris","unit":"celsius"})");
    EXPECT_EQ(r.calls[1].arguments,
              "{\"city\":\"K\xc3\xb8"
              "benhavn\"}");
    expect_split_invariant(ToolCallFormat::kHermes, text);
}

TEST(ToolCallParser, HermesStreamsTextAndHoldsOnlyAPossibleMarker) {
    ToolCallParser p(ToolCallFormat::kHermes);
    EXPECT_EQ(p.feed("The answer").content, "The answer");
    EXPECT_EQ(p.feed(" is <").content, " is");  // "<" may begin <tool_call>; " " may precede it
    EXPECT_EQ(p.feed("b>42</b>").content, " <b>42</b>");
    EXPECT_EQ(p.finish().content, "");
    EXPECT_EQ(p.calls_seen(), 0);
}

TEST(ToolCallParser, HermesBrokenJsonIsText) {
    const std::string text =
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>";
    const Parsed r = parse(ToolCallFormat::kHermes, text);
    EXPECT_TRUE(r.calls.empty());
    EXPECT_EQ(r.content, text);
    expect_split_invariant(ToolCallFormat::kHermes, text);
    // Arguments that are not an object, a missing name, an unclosed call cut by max_tokens.
    for (const char* bad : {"<tool_call>{\"name\": \"f\", \"arguments\": [1, 2]}</tool_call>",
                            "<tool_call>{\"arguments\": {}}</tool_call>",
                            "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": \"unterminated"}) {
        const Parsed b = parse(ToolCallFormat::kHermes, bad);
        EXPECT_TRUE(b.calls.empty()) << bad;
        EXPECT_EQ(b.content, bad);
    }
}

TEST(ToolCallParser, HermesUnclosedButCompleteCallIsACall) {
    // The model stopped at <|im_end|> before writing </tool_call>.
    const Parsed r =
        parse(ToolCallFormat::kHermes, "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n");
    ASSERT_EQ(r.calls.size(), 1u);
    EXPECT_EQ(r.calls[0].name, "now");
    EXPECT_EQ(r.calls[0].arguments, "{}");
    EXPECT_EQ(r.content, "");
}

TEST(ToolCallParser, ArgumentsAsAJsonString) {
    const Parsed r = parse(ToolCallFormat::kHermes,
                           R"(<tool_call>{"name": "f", "arguments": "{\"x\": 1}"}</tool_call>)");
    ASSERT_EQ(r.calls.size(), 1u);
    EXPECT_EQ(r.calls[0].arguments, R"({"x":1})");
}

TEST(ToolCallParser, NotParallelKeepsTheFirstCall) {
    const std::string text =
        "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n"
        "<tool_call>{\"name\": \"b\", \"arguments\": {}}</tool_call>";
    const Parsed r = parse(ToolCallFormat::kHermes, text, 0, /*parallel=*/false);
    ASSERT_EQ(r.calls.size(), 1u);
    EXPECT_EQ(r.calls[0].name, "a");
}

TEST(ToolCallParser, DeepNestingIsTextNotACrash) {
    std::string deep = "<tool_call>{\"name\": \"f\", \"arguments\": ";
    for (int i = 0; i < 100000; ++i) deep += "{\"a\":";
    const Parsed r = parse(ToolCallFormat::kHermes, deep + "</tool_call>");
    EXPECT_TRUE(r.calls.empty());
    EXPECT_EQ(r.content, deep + "</tool_call>");
}

TEST(ToolCallParser, Llama3JsonWholeAnswer) {
    // Llama-3.1-8B-Instruct's custom-tool call (its template asks for "parameters").
    const std::string text =
        "{\"name\": \"get_current_conditions\", \"parameters\": {\"location\": \"San Francisco, "
        "CA\", \"unit\": \"Fahrenheit\"}}";
    const Parsed r = parse(ToolCallFormat::kLlama3Json, text);
    EXPECT_EQ(r.content, "");
    ASSERT_EQ(r.calls.size(), 1u);
    EXPECT_EQ(r.calls[0].name, "get_current_conditions");
    EXPECT_EQ(r.calls[0].arguments, R"({"location":"San Francisco, CA","unit":"Fahrenheit"})");
    expect_split_invariant(ToolCallFormat::kLlama3Json, text);

    const std::string tagged =
        "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"n\": 1}}; {\"name\": \"b\", "
        "\"parameters\": {}}";
    const Parsed t = parse(ToolCallFormat::kLlama3Json, tagged);
    ASSERT_EQ(t.calls.size(), 2u);
    EXPECT_EQ(t.calls[1].name, "b");
    expect_split_invariant(ToolCallFormat::kLlama3Json, tagged);
}

TEST(ToolCallParser, Llama3PlainAnswerStreams) {
    ToolCallParser p(ToolCallFormat::kLlama3Json);
    EXPECT_EQ(p.feed(" ").content, "");
    EXPECT_EQ(p.feed("It is").content, " It is");
    EXPECT_EQ(p.feed(" {sunny}").content, " {sunny}");
    EXPECT_EQ(p.finish().content, "");
    // An answer that starts like JSON and is not a call comes back whole.
    const std::string json_answer = "{\"temperature\": 21}";
    EXPECT_EQ(parse(ToolCallFormat::kLlama3Json, json_answer).content, json_answer);
    EXPECT_TRUE(parse(ToolCallFormat::kLlama3Json, json_answer).calls.empty());
    EXPECT_EQ(parse(ToolCallFormat::kLlama3Json, "<|python_tag|>print(1)").content,
              "<|python_tag|>print(1)");
}

TEST(ToolCallParser, MistralJsonArray) {
    // Mistral-Nemo-Instruct-2407 / v0.3.
    const std::string text =
        "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lyon\"}, \"id\": "
        "\"a1B2c3D4e\"}, {\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}]";
    const Parsed r = parse(ToolCallFormat::kMistral, text);
    EXPECT_EQ(r.content, "");
    ASSERT_EQ(r.calls.size(), 2u);
    EXPECT_EQ(r.calls[0].name, "get_weather");
    EXPECT_EQ(r.calls[0].id, "a1B2c3D4e");
    EXPECT_EQ(r.calls[1].arguments, R"({"tz":"CET"})");
    expect_split_invariant(ToolCallFormat::kMistral, text);
}

TEST(ToolCallParser, MistralSmallArgsFormat) {
    // Mistral-Small-3.2 / Devstral: name[ARGS]{...}, each call after its own [TOOL_CALLS].
    const std::string text =
        "Checking.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Lyon\"}[TOOL_CALLS]get_time"
        "[CALL_ID]x9[ARGS]{}";
    const Parsed r = parse(ToolCallFormat::kMistral, text);
    EXPECT_EQ(r.content, "Checking.");
    ASSERT_EQ(r.calls.size(), 2u);
    EXPECT_EQ(r.calls[0].name, "get_weather");
    EXPECT_EQ(r.calls[0].arguments, R"({"city":"Lyon"})");
    EXPECT_EQ(r.calls[1].name, "get_time");
    EXPECT_EQ(r.calls[1].id, "x9");
    expect_split_invariant(ToolCallFormat::kMistral, text);
    const std::string broken = "[TOOL_CALLS]get_weather[ARGS]{\"city\": ";
    EXPECT_EQ(parse(ToolCallFormat::kMistral, broken).content, broken);
}

TEST(ToolCallParser, NoFormatPassesTextThrough) {
    const std::string text = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
    const Parsed r = parse(ToolCallFormat::kNone, text, 3);
    EXPECT_EQ(r.content, text);
    EXPECT_TRUE(r.calls.empty());
}

TEST(ToolCallFormats, NamesRoundTrip) {
    for (auto f : {ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json, ToolCallFormat::kMistral})
        EXPECT_EQ(tool_call_format_named(tool_call_format_name(f)), f);
    EXPECT_FALSE(tool_call_format_named("pythonic").has_value());
}

std::string read_file(const std::filesystem::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// The format detected from the templates of the models issue 58 names, and the refusals.
TEST(ToolCallFormats, DetectedFromRealTemplates) {
    const std::filesystem::path corpus = testing::models_dir() + "/chat_templates";
    if (!std::filesystem::exists(corpus / ".complete"))
        GTEST_SKIP() << corpus << " is missing: deploy/setup.sh fetches it";
    struct Want {
        const char* file;
        ToolCallFormat format;
        const char* unsupported;
    };
    for (const Want& w : {
             Want{"Qwen-Qwen2.5-7B-Instruct.jinja", ToolCallFormat::kHermes, ""},
             Want{"Qwen-Qwen3-0.6B.jinja", ToolCallFormat::kHermes, ""},
             Want{"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", ToolCallFormat::kHermes, ""},
             Want{"meta-llama-Llama-3.1-8B-Instruct.jinja", ToolCallFormat::kLlama3Json, ""},
             Want{"meta-llama-Llama-3.2-3B-Instruct.jinja", ToolCallFormat::kLlama3Json, ""},
             Want{"mistralai-Mistral-Nemo-Instruct-2407.jinja", ToolCallFormat::kMistral, ""},
             Want{"Mistral-Small-3.2-24B-Instruct-2506.jinja", ToolCallFormat::kMistral, ""},
             Want{"microsoft-Phi-3.5-mini-instruct.jinja", ToolCallFormat::kNone, ""},
             Want{"Qwen3-Coder.jinja", ToolCallFormat::kNone, "qwen3_coder"},
             Want{"deepseek-ai-DeepSeek-V3.1.jinja", ToolCallFormat::kNone, "deepseek"},
         }) {
        std::string unsupported = "x";
        EXPECT_EQ(detect_tool_call_format(read_file(corpus / w.file), &unsupported), w.format)
            << w.file;
        EXPECT_EQ(unsupported, w.unsupported) << w.file;
    }
}

}  // namespace
}  // namespace deltaserve::model
