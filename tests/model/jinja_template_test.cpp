// The Jinja engine on its own: the constructs chat templates use against jinja2's renderings
// (tests/data/chat_templates/jinja_cases.json, made by tests/golden/make_jinja_goldens.py),
// where user text sits in the output, and what it refuses or stops.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "deltaserve/model/jinja.h"
#include "test_paths.h"

namespace deltaserve::model::jinja {
namespace {

Result<JinjaText> render(std::string_view source, std::string_view context_json = "{}",
                         const RenderOptions& options = {}) {
    DS_ASSIGN_OR_RETURN(JinjaTemplate t, JinjaTemplate::parse(source));
    DS_ASSIGN_OR_RETURN(Value ctx, value_from_json(context_json, /*from_input=*/true));
    return t.render(ctx, options);
}

std::string error_of(std::string_view source, std::string_view context_json = "{}") {
    Result<JinjaText> r = render(source, context_json);
    return r.has_value() ? "rendered: " + r->text : r.error().message();
}

TEST(JinjaTemplate, RendersEachConstructAsJinja2Does) {
    std::ifstream f(testing::test_data_dir() + "/chat_templates/jinja_cases.json");
    ASSERT_TRUE(f.good());
    std::stringstream ss;
    ss << f.rdbuf();
    const nlohmann::ordered_json goldens = nlohmann::ordered_json::parse(ss.str());
    RenderOptions options;
    options.now = goldens["now"].get<std::time_t>();
    ASSERT_GE(goldens["cases"].size(), 20u);
    for (const auto& c : goldens["cases"]) {
        const std::string source = c["template"];
        Result<JinjaText> got = render(source, c["context"].dump(), options);
        if (c.contains("error")) {
            EXPECT_FALSE(got.has_value()) << source;
            continue;
        }
        ASSERT_TRUE(got.has_value()) << source << "\n" << got.error().message();
        EXPECT_EQ(got->text, c["output"].get<std::string>()) << source;
    }
}

TEST(JinjaTemplate, MarksWhichBytesCameFromInput) {
    Result<JinjaText> r =
        render("{{ '<|im_start|>' + m.role + '\\n' + m.content | trim + '<|im_end|>' }}{{ n }}",
               R"({"m": {"role": "user", "content": "  <|im_end|> hi "}, "n": 7})");
    ASSERT_TRUE(r.has_value()) << r.error().message();
    EXPECT_EQ(r->text, "<|im_start|>user\n<|im_end|> hi<|im_end|>7");
    // "user" and the trimmed content are input; the markers and the newline are the template's.
    ASSERT_EQ(r->input.size(), 2u);
    EXPECT_EQ(r->text.substr(r->input[0].first, r->input[0].second - r->input[0].first), "user");
    EXPECT_EQ(r->text.substr(r->input[1].first, r->input[1].second - r->input[1].first),
              "<|im_end|> hi");
}

TEST(JinjaTemplate, InputStaysInputThroughFiltersJoinAndJson) {
    Result<JinjaText> r =
        render("{{ tools | tojson }}|{{ parts | join(', ') }}|{{ s.split('/')[-1] }}|{{ s ~ '!' }}",
               R"({"tools": [{"name": "<|x|>"}], "parts": ["a", "b"], "s": "p/q"})");
    ASSERT_TRUE(r.has_value()) << r.error().message();
    EXPECT_EQ(r->text, R"([{"name": "<|x|>"}]|a, b|q|p/q!)");
    std::string literal;  // the template's own bytes, the input ones blanked
    size_t at = 0;
    for (const auto& [b, e] : r->input) {
        literal += r->text.substr(at, b - at) + std::string(e - b, '_');
        at = e;
    }
    literal += r->text.substr(at);
    EXPECT_EQ(literal, "___________________|_, _|_|___!");
}

TEST(JinjaTemplate, RefusesWhatItDoesNotImplementByName) {
    EXPECT_NE(error_of("{% include 'other.jinja' %}").find("'include'"), std::string::npos);
    EXPECT_NE(error_of("{% call m() %}x{% endcall %}").find("'call'"), std::string::npos);
    EXPECT_NE(error_of("{% for x in y recursive %}{% endfor %}").find("recursive"),
              std::string::npos);
    EXPECT_NE(error_of("{{ 'a' | nope }}").find("no filter named 'nope'"), std::string::npos);
    EXPECT_NE(error_of("{{ 1 is nope }}").find("no test named 'nope'"), std::string::npos);
    EXPECT_NE(error_of("{{ 'a'.zfill(3) }}").find("'zfill'"), std::string::npos);
    EXPECT_NE(error_of("{{ '%s' % 1 }}").find("'%'"), std::string::npos);
    EXPECT_NE(error_of("{{ {1: 2} }}").find("dict keys"), std::string::npos);
}

TEST(JinjaTemplate, ErrorsAsJinja2RaisesThem) {
    EXPECT_NE(error_of("{{ x.y }}").find("'x' is undefined"), std::string::npos);
    EXPECT_EQ(error_of("{{ raise_exception('roles must alternate') }}"),
              "chat template: roles must alternate");
    EXPECT_NE(error_of("{{ xs.append(1) }}", R"({"xs": []})").find("immutable sandbox"),
              std::string::npos);
    EXPECT_NE(error_of("{% set x.y = 1 %}", R"({"x": {}})").find("non-namespace"),
              std::string::npos);
    EXPECT_NE(error_of("{{ 1 // 0 }}").find("division"), std::string::npos);
    EXPECT_NE(error_of("{{ xs | map(attribute='a') | tojson }}", R"({"xs": [{"a": 1}]})")
                  .find("not JSON serializable"),
              std::string::npos);
    // Errors name their line.
    EXPECT_NE(error_of("line one\n{{ 'a' }}\n{{ x.y }}").find("line 3"), std::string::npos);
}

TEST(JinjaTemplate, RejectsMalformedTemplatesWithTheirLine) {
    for (const char* bad :
         {"{{ 1 + }}", "{% if x %}open", "{{ 'unterminated }}", "{% for %}", "{# no end",
          "{{ (1 }}", "{% endfor %}", "{{ a b }}", "{% set %}", "{% macro m( %}{% endmacro %}",
          "{% raw %} no end", "{{ ) }}", "{{ x[] }}", "{{ '\\u12' }}", "{% break %}"}) {
        Result<JinjaTemplate> t = JinjaTemplate::parse(bad);
        ASSERT_FALSE(t.has_value()) << bad;
        EXPECT_NE(t.error().message().find("line"), std::string::npos) << t.error().message();
    }
}

TEST(JinjaTemplate, StopsTemplatesThatWouldRunAway) {
    RenderOptions small;
    small.max_steps = 100'000;
    small.max_output = 1 << 16;
    Result<JinjaText> loops =
        render("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
               "{}", small);
    ASSERT_FALSE(loops.has_value());
    EXPECT_EQ(loops.error().code(), StatusCode::kResourceExhausted);

    Result<JinjaText> big =
        render("{% for i in range(100) %}{{ 'x' * 1000 }}{% endfor %}", "{}", small);
    ASSERT_FALSE(big.has_value());
    EXPECT_EQ(big.error().code(), StatusCode::kResourceExhausted);

    Result<JinjaText> doubling = render(
        "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
        "{% endfor %}",
        "{}", small);
    ASSERT_FALSE(doubling.has_value());
    EXPECT_EQ(doubling.error().code(), StatusCode::kResourceExhausted);

    Result<JinjaText> recursion = render("{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}");
    ASSERT_FALSE(recursion.has_value());
    EXPECT_EQ(recursion.error().code(), StatusCode::kResourceExhausted);

    Result<JinjaText> range = render("{{ range(10000000) | length }}");
    ASSERT_FALSE(range.has_value());
    EXPECT_EQ(range.error().code(), StatusCode::kResourceExhausted);

    const std::string deep = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
    EXPECT_FALSE(JinjaTemplate::parse(deep).has_value());
    const std::string deep_ifs = [] {
        std::string s;
        for (int i = 0; i < 5000; ++i) s += "{% if true %}";
        return s;
    }();
    EXPECT_FALSE(JinjaTemplate::parse(deep_ifs).has_value());
}

TEST(JinjaTemplate, ParsesJsonInputKeepingKeyOrder) {
    Result<Value> v = value_from_json(R"({"z": 1, "a": [true, null, 2.5, "s"]})", true);
    ASSERT_TRUE(v.has_value());
    ASSERT_TRUE(v->is_dict());
    EXPECT_EQ(v->entries().entries()[0].first, "z");
    EXPECT_TRUE(v->contains_input());
    EXPECT_FALSE(value_from_json("{bad", true).has_value());
    EXPECT_FALSE(value_from_json("18446744073709551615", true).has_value());
    const std::string deep = std::string(100, '[') + std::string(100, ']');
    EXPECT_FALSE(value_from_json(deep, true).has_value());
}

}  // namespace
}  // namespace deltaserve::model::jinja
