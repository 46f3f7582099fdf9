// End to end: every kind of bad input makes `deltaserve` exit non-zero with exactly one
// line on stderr, "deltaserve: error: ...", naming the problem; nothing crashes.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cctype>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "test_paths.h"

namespace deltaserve::testing {
namespace {

namespace fs = std::filesystem;

constexpr int kUsageError = 2;  // bad command line
constexpr int kRunError = 1;    // bad files, bad prompt

// A fresh temporary directory, removed with everything in it.
class ScratchDir {
  public:
    ScratchDir() {
        std::string tmpl = (fs::temp_directory_path() / "deltaserve_cli_XXXXXX").string();
        if (mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
    }
    ~ScratchDir() {
        std::error_code ec;
        if (!path_.empty()) fs::remove_all(path_, ec);
    }
    ScratchDir(const ScratchDir&) = delete;
    ScratchDir& operator=(const ScratchDir&) = delete;

    const std::string& path() const { return path_; }
    std::string file(const std::string& name) const { return path_ + "/" + name; }

  private:
    std::string path_;
};

// Copies the first `bytes` bytes of `from` (all of it when bytes exceeds its size).
void copy_prefix(const std::string& from, const std::string& to, uint64_t bytes) {
    std::ifstream in(from, std::ios::binary);
    std::ofstream out(to, std::ios::binary | std::ios::trunc);
    std::vector<char> buf(1 << 20);
    while (bytes > 0 && in) {
        in.read(buf.data(), static_cast<std::streamsize>(std::min<uint64_t>(bytes, buf.size())));
        const auto n = in.gcount();
        if (n <= 0) break;
        out.write(buf.data(), n);
        bytes -= static_cast<uint64_t>(n);
    }
    ASSERT_TRUE(out.good()) << "cannot write " << to;
}

// Overwrites bytes of `path` at `offset`.
void patch(const std::string& path, uint64_t offset, const void* data, size_t size) {
    std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(static_cast<std::streamoff>(offset));
    f.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
    ASSERT_TRUE(f.good()) << "cannot patch " << path;
}

std::string lower(std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

// The contract: exit code `code` (any non-zero one when code < 0), no signal, no stdout
// beyond whitespace, and stderr exactly one "deltaserve: error: " line holding `keyword`
// (case-insensitive).
void expect_one_line_error(const CliResult& r, int code, const std::string& keyword) {
    SCOPED_TRACE(r.describe());
    EXPECT_FALSE(r.timed_out);
    EXPECT_EQ(r.term_signal, 0) << "crashed";
    if (code < 0) {
        EXPECT_GT(r.exit_code, 0);
    } else {
        EXPECT_EQ(r.exit_code, code);
    }
    const std::vector<std::string> lines = r.err_lines();
    ASSERT_EQ(lines.size(), 1u) << "stderr should be one line";
    EXPECT_EQ(lines[0].rfind("deltaserve: error: ", 0), 0u);
    EXPECT_NE(lower(lines[0]).find(lower(keyword)), std::string::npos)
        << "'" << keyword << "' not in: " << lines[0];
    EXPECT_FALSE(r.err.empty() || r.err.back() != '\n') << "stderr line not terminated";
    EXPECT_EQ(r.out.find_first_not_of(" \n"), std::string::npos) << "stdout: " << r.out;
}

CliResult generate_with_model(const std::string& model, std::vector<std::string> more = {}) {
    // One thread: the models are tiny and the test machines small and shared.
    std::vector<std::string> args = {"generate", "--model",      model, "--prompt",
                                     "Hello",    "--max-tokens", "4",   "--temperature",
                                     "0",        "--threads",    "1"};
    args.insert(args.end(), more.begin(), more.end());
    return run_deltaserve(args);
}

CliResult generate_stories(std::vector<std::string> more) {
    std::vector<std::string> args = {"generate",
                                     "--model",
                                     stories_model(),
                                     "--tokenizer",
                                     stories_tokenizer(),
                                     "--max-tokens",
                                     "4",
                                     "--temperature",
                                     "0",
                                     "--threads",
                                     "1"};
    args.insert(args.end(), more.begin(), more.end());
    return run_deltaserve(args);
}

uint64_t size_of(const std::string& path) { return static_cast<uint64_t>(fs::file_size(path)); }

// ---- model files -------------------------------------------------------------------

TEST(CliBadInputTest, MissingModelFile) {
    ScratchDir dir;
    expect_one_line_error(generate_with_model(dir.file("no_such_model.gguf")), kRunError,
                          "not found");
}

TEST(CliBadInputTest, EmptyModelFile) {
    ScratchDir dir;
    const std::string path = dir.file("empty.gguf");
    std::ofstream(path).close();
    expect_one_line_error(generate_with_model(path), kRunError, "empty.gguf");
}

TEST(CliBadInputTest, DirectoryWithoutConfigJson) {
    ScratchDir dir;
    std::ofstream(dir.file("README.md")) << "not a model\n";
    expect_one_line_error(generate_with_model(dir.path()), kRunError, "config.json");
}

TEST(CliBadInputTest, GgufTruncatedAfterOneMegabyte) {
    DS_REQUIRE_FILE(default_gguf_model(), "SmolLM2 GGUF");
    ScratchDir dir;
    const std::string path = dir.file("head.gguf");
    copy_prefix(default_gguf_model(), path, 1 << 20);
    expect_one_line_error(generate_with_model(path), kRunError, "truncated");
}

TEST(CliBadInputTest, GgufTruncatedInTheTensorData) {
    DS_REQUIRE_FILE(default_gguf_model(), "SmolLM2 GGUF");
    ScratchDir dir;
    const std::string path = dir.file("cut.gguf");
    copy_prefix(default_gguf_model(), path, size_of(default_gguf_model()) / 10 * 9);
    expect_one_line_error(generate_with_model(path), kRunError, "truncated");
}

// The header is magic (4 bytes), version (u32), tensor count (u64), metadata count (u64).
// A whole copy is patched, so that the header fault is the only one in the file.
class CliCorruptGgufTest : public ::testing::Test {
  protected:
    void SetUp() override {
        DS_REQUIRE_FILE(default_gguf_model(), "SmolLM2 GGUF");
        path_ = dir_.file("corrupt.gguf");
        copy_prefix(default_gguf_model(), path_, size_of(default_gguf_model()));
    }
    ScratchDir dir_;
    std::string path_;
};

TEST_F(CliCorruptGgufTest, BadMagic) {
    patch(path_, 0, "GGUX", 4);
    expect_one_line_error(generate_with_model(path_), kRunError, "not a GGUF");
}

TEST_F(CliCorruptGgufTest, Version99) {
    const uint32_t version = 99;
    patch(path_, 4, &version, sizeof(version));
    expect_one_line_error(generate_with_model(path_), kRunError, "version 99");
}

TEST_F(CliCorruptGgufTest, GarbageMetadataCount) {
    const uint64_t count = 0xDEADBEEFCAFEF00Dull;
    patch(path_, 16, &count, sizeof(count));
    expect_one_line_error(generate_with_model(path_), kRunError, "corrupt");
}

TEST_F(CliCorruptGgufTest, PlausibleButWrongMetadataCount) {
    const uint64_t count = 60000;  // passes a sanity bound, then runs into the tensor table
    patch(path_, 16, &count, sizeof(count));
    expect_one_line_error(generate_with_model(path_), kRunError, "corrupt");
}

TEST(CliBadInputTest, TruncatedLlama2cCheckpoint) {
    DS_REQUIRE_FILE(stories_model(), "stories260K.bin");
    ScratchDir dir;
    const std::string half = dir.file("half.bin"), header = dir.file("header.bin");
    copy_prefix(stories_model(), half, size_of(stories_model()) / 2);
    copy_prefix(stories_model(), header, 12);
    expect_one_line_error(generate_with_model(half, {"--tokenizer", stories_tokenizer()}),
                          kRunError, "truncated");
    expect_one_line_error(generate_with_model(header, {"--tokenizer", stories_tokenizer()}),
                          kRunError, "too small");
}

// ---- tokenizer files ---------------------------------------------------------------

TEST(CliBadInputTest, Llama2cModelWithoutTokenizer) {
    DS_REQUIRE_FILE(stories_model(), "stories260K.bin");
    expect_one_line_error(generate_with_model(stories_model()), kRunError, "tokenizer");
}

TEST(CliBadInputTest, MissingTokenizerFile) {
    DS_REQUIRE_FILE(stories_model(), "stories260K.bin");
    ScratchDir dir;
    expect_one_line_error(
        generate_with_model(stories_model(), {"--tokenizer", dir.file("tok.bin")}), kRunError,
        "tokenizer");
}

TEST(CliBadInputTest, TruncatedTokenizerFile) {
    DS_REQUIRE_FILE(stories_model(), "stories260K.bin");
    DS_REQUIRE_FILE(stories_tokenizer(), "tok512.bin");
    ScratchDir dir;
    const std::string half = dir.file("tok_half.bin"), empty = dir.file("tok_empty.bin");
    copy_prefix(stories_tokenizer(), half, size_of(stories_tokenizer()) / 2);
    std::ofstream(empty).close();
    expect_one_line_error(generate_with_model(stories_model(), {"--tokenizer", half}), kRunError,
                          "truncated");
    expect_one_line_error(generate_with_model(stories_model(), {"--tokenizer", empty}), kRunError,
                          "empty");
}

// ---- prompts -----------------------------------------------------------------------

TEST(CliBadInputTest, PromptLongerThanTheContext) {
    DS_REQUIRE_FILE(stories_model(), "stories260K.bin");
    DS_REQUIRE_FILE(stories_tokenizer(), "tok512.bin");
    std::string prompt;
    for (int i = 0; i < 40; ++i) prompt += "Once upon a time there was a little girl. ";
    expect_one_line_error(generate_stories({"--ctx-size", "64", "--prompt", prompt}), kRunError,
                          "context");
}

TEST(CliBadInputTest, InvalidUtf8Prompt) {
    DS_REQUIRE_FILE(stories_model(), "stories260K.bin");
    DS_REQUIRE_FILE(stories_tokenizer(), "tok512.bin");
    expect_one_line_error(generate_stories({"--prompt", "ab\xff\xfe"}), kRunError, "UTF-8");
}

// ---- command line ------------------------------------------------------------------

TEST(CliBadInputTest, UnknownFlag) {
    expect_one_line_error(run_deltaserve({"generate", "--prompt", "x", "--frobnicate", "3"}),
                          kUsageError, "--frobnicate");
    expect_one_line_error(run_deltaserve({"chat", "--frobnicate"}), kUsageError, "unknown flag");
}

TEST(CliBadInputTest, UnknownSubcommand) {
    expect_one_line_error(run_deltaserve({"serve-the-moon"}), kUsageError, "serve-the-moon");
}

TEST(CliBadInputTest, FlagWithoutValue) {
    const CliResult r = run_deltaserve({"generate", "--prompt", "x", "--model"});
    expect_one_line_error(r, kUsageError, "--model");
    EXPECT_NE(r.err.find("value"), std::string::npos) << r.err;
}

TEST(CliBadInputTest, NonNumericMaxTokens) {
    expect_one_line_error(run_deltaserve({"generate", "--prompt", "x", "--max-tokens", "lots"}),
                          kUsageError, "--max-tokens");
    expect_one_line_error(run_deltaserve({"generate", "--prompt", "x", "--max-tokens", "12abc"}),
                          kUsageError, "--max-tokens");
}

TEST(CliBadInputTest, UnknownKvType) {
    DS_REQUIRE_FILE(stories_model(), "stories260K.bin");
    DS_REQUIRE_FILE(stories_tokenizer(), "tok512.bin");
    expect_one_line_error(generate_stories({"--prompt", "x", "--kv-type", "q9"}), -1, "--kv-type");
}

TEST(CliBadInputTest, UnknownAttentionOrOneWithoutItsCache) {
    DS_REQUIRE_FILE(stories_model(), "stories260K.bin");
    DS_REQUIRE_FILE(stories_tokenizer(), "tok512.bin");
    expect_one_line_error(generate_stories({"--prompt", "x", "--attention", "fast"}), -1,
                          "--attention");
    expect_one_line_error(
        generate_stories({"--prompt", "x", "--attention", "ggml", "--kv-type", "f32"}), -1,
        "f16 KV cache");
}

TEST(CliBadInputTest, UnknownDeviceOrOneNotHere) {
    DS_REQUIRE_FILE(stories_model(), "stories260K.bin");
    DS_REQUIRE_FILE(stories_tokenizer(), "tok512.bin");
    expect_one_line_error(generate_stories({"--prompt", "x", "--device", "tpu"}), -1,
                          "--device must be cpu or cuda");
    expect_one_line_error(
        generate_stories({"--prompt", "x", "--device", "cuda", "--attention", "ggml"}), -1,
        "CPU only");
    if (std::filesystem::exists("/dev/nvidiactl"))
        GTEST_SKIP() << "a GPU is here: --device cuda runs";
    expect_one_line_error(generate_stories({"--prompt", "x", "--device", "cuda"}), -1,
                          "--device cuda");
}

// The device tier lives in a GPU's memory: on the CPU the flag is refused before anything
// loads, as is a size that does not parse.
TEST(CliBadInputTest, ADeviceTierWithoutAGpu) {
    DS_REQUIRE_FILE(stories_model(), "stories260K.bin");
    DS_REQUIRE_FILE(stories_tokenizer(), "tok512.bin");
    const std::vector<std::string> serve = {"serve",
                                            "--model",
                                            stories_model(),
                                            "--tokenizer",
                                            stories_tokenizer(),
                                            "--data-dir",
                                            "none",
                                            "--port",
                                            "0"};
    auto with = [&](std::vector<std::string> more) {
        std::vector<std::string> args = serve;
        args.insert(args.end(), more.begin(), more.end());
        return run_deltaserve(args);
    };
    expect_one_line_error(with({"--device", "cpu", "--kv-device-memory", "1GiB"}), 2,
                          "--kv-device-memory: the device tier needs a GPU");
    expect_one_line_error(with({"--kv-device-memory", "lots"}), 2, "--kv-device-memory");
}

}  // namespace
}  // namespace deltaserve::testing
