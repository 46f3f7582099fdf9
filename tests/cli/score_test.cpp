// deltaserve score: the JSON contract (tokens, ppl, ppl_full, kl_mean, keep_ratio) on real
// English text from a Debian package, and its errors.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli_runner.h"
#include "test_paths.h"

namespace deltaserve::testing {
namespace {

namespace fs = std::filesystem;

constexpr const char* kLicense = "/usr/share/common-licenses/GPL-3";  // base-files

// The first `chars` characters of the GPL-3 text in a temporary file, removed on scope exit.
class TextFile {
public:
    explicit TextFile(size_t chars) {
        std::ifstream in(kLicense);
        std::stringstream s;
        s << in.rdbuf();
        std::string tmpl = (fs::temp_directory_path() / "deltaserve_score_XXXXXX").string();
        const int fd = mkstemp(tmpl.data());
        if (fd >= 0) close(fd);
        path_ = tmpl;
        std::ofstream(path_) << s.str().substr(0, chars);
    }
    ~TextFile() { std::remove(path_.c_str()); }
    const std::string& path() const { return path_; }

private:
    std::string path_;
};

CliResult score(const std::string& text, const std::vector<std::string>& more) {
    std::vector<std::string> args = {"score", "--model", default_gguf_model(), "--text", text, "--threads", "2",
                                     "--batch-size", "128"};
    args.insert(args.end(), more.begin(), more.end());
    return run_deltaserve(args);
}

TEST(CliScoreTest, PolicyAgainstFullKv) {
    DS_REQUIRE_FILE(default_gguf_model(), "SmolLM2 GGUF");
    DS_REQUIRE_FILE(std::string(kLicense), "GPL-3 text");
    TextFile text(2500);
    const CliResult r = score(text.path(), {"--kv-policy", "h2o", "--kv-keep", "0.4"});
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_GT(j["tokens"].get<int>(), 400);
    EXPECT_EQ(j["scored"].get<int>(), j["tokens"].get<int>() - 1);
    const double ppl = j["ppl"], ppl_full = j["ppl_full"], kl = j["kl_mean"], kr = j["keep_ratio"];
    EXPECT_GT(ppl_full, 1.0);
    EXPECT_LT(ppl_full, 100.0) << "a working model reads English far better than this";
    EXPECT_GT(ppl, 1.0);
    EXPECT_GT(kl, 0.0) << "evicting 60% of the cache changes something";
    EXPECT_LT(kl, 2.0);
    EXPECT_LE(kr, 0.4);
    EXPECT_GT(kr, 0.35);
}

TEST(CliScoreTest, FullKvScoresItself) {
    DS_REQUIRE_FILE(default_gguf_model(), "SmolLM2 GGUF");
    DS_REQUIRE_FILE(std::string(kLicense), "GPL-3 text");
    TextFile text(800);
    const CliResult r = score(text.path(), {});
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["ppl"].get<double>(), j["ppl_full"].get<double>());
    EXPECT_EQ(j["kl_mean"].get<double>(), 0.0);
    EXPECT_EQ(j["keep_ratio"].get<double>(), 1.0);
}

TEST(CliScoreTest, BadArguments) {
    DS_REQUIRE_FILE(default_gguf_model(), "SmolLM2 GGUF");
    TextFile text(300);
    for (const auto& [args, word] : std::vector<std::pair<std::vector<std::string>, std::string>>{
             {{"--kv-policy", "magic", "--kv-keep", "0.5"}, "unknown KV policy"},
             {{"--kv-policy", "h2o", "--kv-keep", "0"}, "--kv-keep"},
             {{"--kv-policy", "deltakv", "--kv-keep", "0.3", "--kv-select", "1.5"}, "--kv-select"},
             {{"--kv-policy", "deltakv", "--kv-keep", "0.3", "--kv-score-every", "-1"}, "--kv-score-every"},
             {{"--kv-policy", "deltakv", "--kv-keep", "0.3", "--kv-score-dims", "0"}, "--kv-score-dims"},
             {{"--kv-policy", "deltakv", "--kv-keep", "0.3", "--kv-pin", "1"}, "--kv-pin"},
             {{"--kv-policy", "deltakv", "--kv-keep", "0.3", "--kv-follow", "-1"}, "--kv-follow"},
             {{"--kv-policy", "deltakv", "--kv-keep", "0.3", "--kv-exact", "1"}, "--kv-exact"},
             {{"--kv-keep", "0.5"}, "--kv-policy"}}) {
        const CliResult r = score(text.path(), args);
        EXPECT_NE(r.exit_code, 0) << r.describe();
        EXPECT_NE(r.err.find(word), std::string::npos) << r.describe();
    }
    const CliResult missing = run_deltaserve({"score", "--model", default_gguf_model(), "--text", "/no/such/file"});
    EXPECT_NE(missing.exit_code, 0);
    EXPECT_NE(missing.err.find("cannot open"), std::string::npos) << missing.describe();
}

}  // namespace
}  // namespace deltaserve::testing
