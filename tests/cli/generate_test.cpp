// End to end: `deltaserve generate` run as a subprocess on the test models.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "test_paths.h"

namespace deltaserve::testing {
namespace {

std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

std::string without_final_newline(std::string s) {
    if (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
}

// --threads 1 everywhere: these models are tiny, and on a loaded 2-core machine the thread
// pool's spin-waits have made 2-thread runs up to a hundred times slower.
std::vector<std::string> stories_args(const std::string& prompt, int max_tokens) {
    return {"generate",
            "--model",
            stories_model(),
            "--tokenizer",
            stories_tokenizer(),
            "--threads",
            "1",
            "--prompt",
            prompt,
            "--max-tokens",
            std::to_string(max_tokens)};
}

std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& more) {
    args.insert(args.end(), more.begin(), more.end());
    return args;
}

// The acceptance command: greedy decoding reproduces llama2.c's run.c output.
TEST(CliGenerateTest, StoriesGreedyMatchesGolden) {
    DS_REQUIRE_FILE(stories_model(), "stories260K.bin");
    DS_REQUIRE_FILE(stories_tokenizer(), "tok512.bin");
    const std::string golden_path = shared_dir() + "/models/stories260K.greedy200.txt";
    DS_REQUIRE_FILE(golden_path, "stories260K.greedy200.txt");

    const CliResult r = run_deltaserve(with(stories_args("", 200), {"--temperature", "0"}));
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    EXPECT_EQ(without_final_newline(r.out), without_final_newline(read_text(golden_path)));
}

// Logs (even at --log-level debug) go to stderr; stdout holds the generated text alone.
TEST(CliGenerateTest, StdoutHoldsOnlyTheText) {
    DS_REQUIRE_FILE(stories_model(), "stories260K.bin");
    DS_REQUIRE_FILE(stories_tokenizer(), "tok512.bin");
    const CliResult quiet = run_deltaserve(with(stories_args("", 40), {"--temperature", "0"}));
    const CliResult chatty =
        run_deltaserve(with(stories_args("", 40), {"--temperature", "0", "--log-level", "debug"}));
    ASSERT_EQ(quiet.exit_code, 0) << quiet.describe();
    ASSERT_EQ(chatty.exit_code, 0) << chatty.describe();
    EXPECT_EQ(quiet.err, "") << "default log level writes to stderr on success";
    EXPECT_FALSE(chatty.err.empty()) << "--log-level debug logged nothing";
    EXPECT_EQ(chatty.out, quiet.out) << "log output leaked into stdout";
    ASSERT_FALSE(quiet.out.empty());
    EXPECT_EQ(quiet.out.back(), '\n');
}

TEST(CliGenerateTest, SameSeedSameSample) {
    DS_REQUIRE_FILE(stories_model(), "stories260K.bin");
    DS_REQUIRE_FILE(stories_tokenizer(), "tok512.bin");
    auto sampled = [](const char* seed) {
        return run_deltaserve(
            with(stories_args("Once upon a time", 100), {"--temperature", "0.8", "--seed", seed}));
    };
    const CliResult a = sampled("42"), b = sampled("42"), c = sampled("7");
    ASSERT_EQ(a.exit_code, 0) << a.describe();
    ASSERT_EQ(b.exit_code, 0) << b.describe();
    ASSERT_EQ(c.exit_code, 0) << c.describe();
    EXPECT_GT(a.out.size(), 20u);
    EXPECT_EQ(a.out, b.out);
    // 100 tokens at temperature 0.8: another seed all but surely samples something else.
    EXPECT_NE(a.out, c.out) << "--seed seems to be ignored";
}

TEST(CliGenerateTest, HelpListsTheFlags) {
    const CliResult r = run_deltaserve({"generate", "--help"});
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    for (const char* flag : {"--model", "--tokenizer", "--prompt", "--max-tokens", "--temperature",
                             "--seed", "--ctx-size", "--kv-type", "--chat", "--help"}) {
        EXPECT_NE(r.out.find(flag), std::string::npos) << flag << " missing from:\n" << r.out;
    }
    EXPECT_EQ(r.err, "");

    const CliResult top = run_deltaserve({"--help"});
    ASSERT_EQ(top.exit_code, 0) << top.describe();
    EXPECT_NE(top.out.find("generate"), std::string::npos) << top.out;
    EXPECT_NE(top.out.find("chat"), std::string::npos) << top.out;

    const CliResult chat = run_deltaserve({"chat", "--help"});
    ASSERT_EQ(chat.exit_code, 0) << chat.describe();
    EXPECT_NE(chat.out.find("--system"), std::string::npos) << chat.out;
}

TEST(CliGenerateTest, SmolLm2ChatPrompt) {
    DS_REQUIRE_FILE(default_gguf_model(), "SmolLM2 GGUF");
    const CliResult r =
        run_deltaserve({"generate", "--model", default_gguf_model(), "--chat", "--threads", "1",
                        "--prompt", "Hi", "--max-tokens", "8", "--temperature", "0"});
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    EXPECT_FALSE(without_final_newline(r.out).empty()) << r.describe();
    EXPECT_EQ(r.out.find("<|im_start|>"), std::string::npos) << "prompt echoed: " << r.out;
}

// --attention ggml is a complete generation path of its own (the golden test checks its
// numbers against llama.cpp's): greedy output is deterministic and not the prompt echoed.
TEST(CliGenerateTest, GgmlAttentionGenerates) {
    DS_REQUIRE_FILE(default_gguf_model(), "SmolLM2 GGUF");
    const std::vector<std::string> args = {
        "generate", "--model",  default_gguf_model(),       "--threads",    "2",  "--attention",
        "ggml",     "--prompt", "The capital of France is", "--max-tokens", "12", "--temperature",
        "0"};
    const CliResult a = run_deltaserve(args);
    const CliResult b = run_deltaserve(args);
    ASSERT_EQ(a.exit_code, 0) << a.describe();
    EXPECT_FALSE(without_final_newline(a.out).empty()) << a.describe();
    EXPECT_EQ(a.out, b.out);
    EXPECT_NE(a.out.find("Paris"), std::string::npos) << a.out;
}

// --device cpu is what a machine without a GPU runs by default: the same text.
TEST(CliGenerateTest, DeviceCpuIsTheDefaultHere) {
    DS_REQUIRE_FILE(default_gguf_model(), "SmolLM2 GGUF");
    if (std::filesystem::exists("/dev/nvidiactl"))
        GTEST_SKIP() << "a GPU is here: the default is cuda";
    std::vector<std::string> args = {"generate",
                                     "--model",
                                     default_gguf_model(),
                                     "--threads",
                                     "2",
                                     "--prompt",
                                     "The capital of France is",
                                     "--max-tokens",
                                     "12",
                                     "--temperature",
                                     "0"};
    const CliResult a = run_deltaserve(args);
    args.insert(args.end(), {"--device", "cpu"});
    const CliResult b = run_deltaserve(args);
    ASSERT_EQ(a.exit_code, 0) << a.describe();
    ASSERT_EQ(b.exit_code, 0) << b.describe();
    EXPECT_EQ(a.out, b.out);
    EXPECT_EQ(a.err, b.err);  // nothing said about devices on a machine without one
}

}  // namespace
}  // namespace deltaserve::testing
