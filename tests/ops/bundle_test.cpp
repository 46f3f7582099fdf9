// deltactl export / import: a session written to one file on one data dir and taken into
// another continues there with the same answer as on the first (its KV from disk, not
// recomputed); a damaged bundle, a session imported twice and a running server's data dir
// are refused, and nothing is written then.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "cli_runner.h"
#include "http_client.h"
#include "serving.h"
#include "test_paths.h"

namespace deltaserve::testing {
namespace {

namespace fs = std::filesystem;

CliResult deltactl(const std::vector<std::string>& args) {
    return run_binary(deltactl_binary(), args, "", std::chrono::seconds(60));
}

json turn(uint16_t port, const std::string& message) {
    HttpResponse r = post_chat(port, chat_body(message, 16), "X-Session-ID: ada\r\n");
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body, nullptr, false);
}

class BundleTest : public ::testing::TestWithParam<bool> {  // DeltaKV, or full KV
  protected:
    void SetUp() override {
        DS_REQUIRE_FILE(default_gguf_model(), "default GGUF model");
        base_ = (fs::temp_directory_path() /
                 ("ds_bundle_" + std::to_string(::getpid()) + (GetParam() ? "_dkv" : "_full")))
                    .string();
        fs::remove_all(base_);
        fs::create_directories(base_);
    }
    void TearDown() override { fs::remove_all(base_); }
    std::vector<std::string> args(const std::string& dir) const {
        std::vector<std::string> more = {"--data-dir", dir};
        if (GetParam()) {
            more.insert(more.end(), {"--kv-policy", "deltakv", "--kv-keep", "0.3", "--kv-profile",
                                     default_deltakv_profile()});
        }
        return serve_args(more);
    }
    std::string base_;
};

TEST_P(BundleTest, AnImportedSessionContinuesWithTheSameAnswer) {
    const std::string a = base_ + "/a", b = base_ + "/b", file = base_ + "/ada.dsbundle";
    {
        ServingProcess server(args(a));
        ASSERT_NE(server.port(), 0) << server.log();
        ASSERT_EQ(open_session(server.port(), "ada"), 200);
        turn(server.port(),
             "My name is Ada and I keep bees on a hill above the river, where the clover grows "
             "in summer. Say hello to me and tell me something about bees.");
        turn(server.port(), "What do bees make? One sentence.");
        // A running server's store is not exported from.
        EXPECT_EQ(deltactl({"export", "ada", "--data-dir", a, "-o", file}).exit_code, 1);
        EXPECT_EQ(server.stop(), 0);
    }
    const CliResult exported = deltactl({"export", "ada", "--data-dir", a, "-o", file});
    ASSERT_EQ(exported.exit_code, 0) << exported.describe();
    EXPECT_NE(exported.out.find("exported session ada:"), std::string::npos) << exported.out;
    const CliResult imported = deltactl({"import", file, "--data-dir", b});
    ASSERT_EQ(imported.exit_code, 0) << imported.describe();
    // Twice: refused, as is a damaged bundle.
    EXPECT_EQ(deltactl({"import", file, "--data-dir", b}).exit_code, 1);
    {
        std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(static_cast<std::streamoff>(fs::file_size(file) / 2));
        f.put('\x5a');
    }
    const CliResult damaged = deltactl({"import", file, "--data-dir", base_ + "/c"});
    EXPECT_EQ(damaged.exit_code, 1) << damaged.describe();
    EXPECT_NE(damaged.err.find("checksum"), std::string::npos) << damaged.err;
    EXPECT_FALSE(fs::exists(base_ + "/c/kv/index")) << "nothing written for a bad bundle";

    // The same third turn on the first data dir and on the second.
    json there, here;
    {
        ServingProcess server(args(a));
        ASSERT_NE(server.port(), 0) << server.log();
        there = turn(server.port(), "And what is my name?");
    }
    {
        ServingProcess server(args(b));
        ASSERT_NE(server.port(), 0) << server.log();
        const HttpResponse info = http_request(server.port(), "GET", "/v1/sessions/ada");
        ASSERT_EQ(info.status, 200) << info.body;
        EXPECT_EQ(json::parse(info.body)["turns"], 2);
        here = turn(server.port(), "And what is my name?");
    }
    EXPECT_EQ(here["choices"][0]["message"]["content"], there["choices"][0]["message"]["content"]);
    EXPECT_EQ(here["usage"]["prompt_tokens_details"]["kv_source"], "disk") << here.dump();
    EXPECT_EQ(here["usage"]["prompt_tokens_details"]["cached_tokens"],
              there["usage"]["prompt_tokens_details"]["cached_tokens"]);
}

TEST(BundleUsage, MissingArgumentsAreUsageErrors) {
    EXPECT_EQ(deltactl({"export"}).exit_code, 2);
    EXPECT_EQ(deltactl({"export", "ada"}).exit_code, 2);
    EXPECT_EQ(deltactl({"import"}).exit_code, 2);
    const CliResult none = deltactl({"import", "/nonexistent/bundle"});
    EXPECT_EQ(none.exit_code, 1) << none.describe();
}

INSTANTIATE_TEST_SUITE_P(Policies, BundleTest, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "DeltaKv" : "FullKv"; });

}  // namespace
}  // namespace deltaserve::testing
