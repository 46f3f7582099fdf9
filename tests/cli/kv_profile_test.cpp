// A KV policy's profile when there is none: refused with the commands that make one, or
// made at start with --kv-calibrate. (The main command serves full KV without any.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "test_paths.h"

namespace deltaserve::testing {
namespace {

namespace fs = std::filesystem;

// A scratch folder to run in (profiles/ is found relative to the working directory).
class KvProfileTest : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() / ("kv-profile-" + std::to_string(getpid()));
        fs::remove_all(dir_);
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }

    // `deltaserve args...` run in dir_.
    CliResult run_in_dir(const std::vector<std::string>& args, std::chrono::seconds timeout) {
        std::string cmd = "cd '" + dir_.string() + "' && exec '" + deltaserve_binary() + "'";
        for (const auto& a : args) cmd += " '" + a + "'";
        return run_binary("/bin/sh", {"-c", cmd}, "", timeout);
    }

    fs::path dir_;
};

TEST_F(KvProfileTest, DeltaKvWithoutAProfileIsRefusedNamingTheCommands) {
    DS_REQUIRE_FILE(default_gguf_model(), "default model");
    const CliResult r = run_in_dir({"generate", "--model", default_gguf_model(), "--kv-policy",
                                    "deltakv", "--prompt", "hi", "--max-tokens", "2"},
                                   std::chrono::seconds(30));
    EXPECT_EQ(r.exit_code, 1) << r.describe();
    EXPECT_NE(r.err.find("needs a DeltaKV profile"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("deltactl calibrate --model " + default_gguf_model()), std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("--kv-calibrate"), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty());
    EXPECT_FALSE(fs::exists(dir_ / "profiles"));  // nothing made without being asked
    // Full KV needs no profile and runs at once.
    const CliResult full = run_in_dir({"generate", "--model", default_gguf_model(), "--prompt",
                                       "hi", "--max-tokens", "2", "--threads", "1"},
                                      std::chrono::seconds(60));
    EXPECT_EQ(full.exit_code, 0) << full.describe();
}

TEST_F(KvProfileTest, KvCalibrateMakesTheProfileThenRunsWithIt) {
    DS_REQUIRE_FILE(stories_model(), "stories260K.bin");
    DS_REQUIRE_FILE(stories_tokenizer(), "tok512.bin");
    const std::vector<std::string> args = {"generate",    "--model",           stories_model(),
                                           "--tokenizer", stories_tokenizer(), "--kv-policy",
                                           "deltakv",     "--threads",         "1",
                                           "--prompt",    "Once upon a time",  "--max-tokens",
                                           "24",          "--temperature",     "0"};
    std::vector<std::string> calibrating = args;
    calibrating.push_back("--kv-calibrate");
    const CliResult made = run_in_dir(calibrating, std::chrono::seconds(600));
    ASSERT_EQ(made.exit_code, 0) << made.describe();
    EXPECT_NE(made.err.find("calibrating one into profiles/stories260K.bin"), std::string::npos)
        << made.err;
    ASSERT_TRUE(fs::exists(dir_ / "profiles/stories260K.bin/deltakv.json"));
    EXPECT_FALSE(made.out.empty());
    // The next run finds it where --kv-calibrate put it and generates the same.
    const CliResult again = run_in_dir(args, std::chrono::seconds(60));
    ASSERT_EQ(again.exit_code, 0) << again.describe();
    EXPECT_EQ(again.out, made.out);
    EXPECT_EQ(again.err.find("calibrating"), std::string::npos) << again.err;
}

}  // namespace
}  // namespace deltaserve::testing
