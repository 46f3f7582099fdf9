// End to end: `deltaserve chat` with messages piped to its stdin (SmolLM2: stories260K has
// no chat template). With stdin not a terminal there is no "> " prompt; each reply is
// one line of stdout (the model may put newlines inside a reply, so counts are lower bounds).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli_runner.h"
#include "test_paths.h"

namespace deltaserve::testing {
namespace {

// --threads 1 everywhere: SmolLM2 is small, and on a loaded 2-core machine the thread
// pool's spin-waits have made 2-thread runs up to a hundred times slower.
CliResult chat(const std::string& input, std::vector<std::string> more = {}) {
    std::vector<std::string> args = {
        "chat",      "--model", default_gguf_model(), "--temperature", "0", "--max-tokens", "16",
        "--threads", "1"};
    args.insert(args.end(), more.begin(), more.end());
    return run_deltaserve(args, input);
}

size_t count_lines(const std::string& s) {
    size_t n = 0;
    for (char c : s) n += c == '\n';
    return n;
}

TEST(CliChatTest, TwoMessagesTwoReplies) {
    DS_REQUIRE_FILE(default_gguf_model(), "SmolLM2 GGUF");
    const CliResult r = chat("Hi\nWhat is the capital of France?\n");
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    EXPECT_EQ(r.err, "") << "nothing should go wrong";
    EXPECT_GE(count_lines(r.out), 2u) << r.describe();
    // Greedy: the first reply is the same as when "Hi" is the only message.
    const CliResult one = chat("Hi\n");
    ASSERT_EQ(one.exit_code, 0) << one.describe();
    ASSERT_FALSE(one.out.empty());
    EXPECT_EQ(r.out.rfind(one.out, 0), 0u) << "first reply differs:\n"
                                           << one.out << "\nvs\n"
                                           << r.out;
    EXPECT_GT(r.out.size(), one.out.size()) << "no second reply";
}

// After /reset the conversation starts over: asking the first question again gives the
// same greedy reply as in a fresh process.
TEST(CliChatTest, ResetStartsOver) {
    DS_REQUIRE_FILE(default_gguf_model(), "SmolLM2 GGUF");
    const CliResult fresh = chat("Hi\n");
    ASSERT_EQ(fresh.exit_code, 0) << fresh.describe();
    const CliResult r = chat("Hi\n/reset\nHi\n/exit\nnot read\n");
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    EXPECT_EQ(r.err, "");
    EXPECT_EQ(r.out, fresh.out + fresh.out);
}

TEST(CliChatTest, InvalidUtf8LineIsReportedAndTheChatGoesOn) {
    DS_REQUIRE_FILE(default_gguf_model(), "SmolLM2 GGUF");
    const CliResult fresh = chat("Hi\n");
    ASSERT_EQ(fresh.exit_code, 0) << fresh.describe();
    const CliResult r = chat("bad \xff\xfe line\nHi\n");
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    EXPECT_EQ(r.term_signal, 0);
    const std::vector<std::string> lines = r.err_lines();
    ASSERT_EQ(lines.size(), 1u) << r.describe();
    EXPECT_EQ(lines[0].rfind("deltaserve: error: ", 0), 0u) << lines[0];
    EXPECT_NE(lines[0].find("UTF-8"), std::string::npos) << lines[0];
    // The bad line left no trace: the reply to "Hi" is the fresh one.
    EXPECT_EQ(r.out, fresh.out);
}

TEST(CliChatTest, EmptyInputExitsCleanly) {
    DS_REQUIRE_FILE(default_gguf_model(), "SmolLM2 GGUF");
    const CliResult r = chat("");
    EXPECT_EQ(r.exit_code, 0) << r.describe();
    EXPECT_EQ(r.out, "");
}

}  // namespace
}  // namespace deltaserve::testing
