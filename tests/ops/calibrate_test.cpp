// deltactl calibrate end to end on stories260K: KV recorded, compressors trained (each
// layer's reconstruction better than the reference mean alone), a profile written whose
// weights have the documented names and shapes; and its errors.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>

#include "cli_runner.h"
#include "test_paths.h"

namespace deltaserve::testing {
namespace {

namespace fs = std::filesystem;

constexpr const char* kText = "/usr/share/common-licenses/GPL-2";

class CalibrateTest : public ::testing::Test {
  protected:
    void SetUp() override {
        DS_REQUIRE_FILE(stories_model(), "stories260K.bin");
        DS_REQUIRE_FILE(std::string(kText), "GPL-2 text (base-files)");
        out_ =
            (fs::temp_directory_path() / ("deltactl_test_" + std::to_string(::getpid()))).string();
    }
    void TearDown() override {
        std::error_code ec;
        fs::remove_all(out_, ec);
    }
    CliResult calibrate(const std::vector<std::string>& more) {
        std::vector<std::string> args = {"calibrate",
                                         "--model",
                                         stories_model(),
                                         "--tokenizer",
                                         stories_tokenizer(),
                                         "--text",
                                         kText,
                                         "--tokens",
                                         "1200",
                                         "--seq-len",
                                         "400",
                                         "--epochs",
                                         "3",
                                         "--trimkv-tokens",
                                         "512",
                                         "--trimkv-seq",
                                         "128",
                                         "--trimkv-epochs",
                                         "2",
                                         "--threads",
                                         "2",
                                         "--out",
                                         out_};
        // A flag of `more` replaces the default's (a flag given twice is refused).
        for (const std::string& flag : more) {
            if (flag.rfind("--", 0) != 0) continue;
            for (size_t i = 1; i + 1 < args.size(); ++i) {
                if (args[i] == flag) {
                    args.erase(args.begin() + static_cast<std::ptrdiff_t>(i),
                               args.begin() + static_cast<std::ptrdiff_t>(i) + 2);
                    break;
                }
            }
        }
        args.insert(args.end(), more.begin(), more.end());
        return run_binary(deltactl_binary(), args, "", std::chrono::seconds(120));
    }
    std::string out_;
};

TEST_F(CalibrateTest, WritesAProfileThatBeatsTheReferenceMean) {
    const CliResult r = calibrate({});
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    EXPECT_NE(r.err.find("[train] layer 5/5 epoch 3/3"), std::string::npos) << "progress is shown";
    std::ifstream in(out_ + "/deltakv.json");
    const auto p = nlohmann::json::parse(in);
    EXPECT_EQ(p["format"], "deltaserve-deltakv/1");
    const int d = p["D"], m = p["m"], hidden = p["hidden"];
    EXPECT_EQ(d, 64);  // 2 x 4 KV heads x 8
    EXPECT_EQ(m, d / 4);
    EXPECT_EQ(p["k"], 4);
    EXPECT_EQ(p["stride"], 10);
    ASSERT_EQ(p["layers"].size(), 5u);
    for (const auto& l : p["layers"]) {
        EXPECT_LT(l["mse"].get<double>(), l["mse_ref_mean"].get<double>()) << l.dump();
    }
    EXPECT_FALSE(fs::exists(out_ + "/kv")) << "recorded KV is removed unless --keep-kv yes";
    // Sensitivity was measured for every layer (any may be compressed), the order is most
    // sensitive first.
    ASSERT_EQ(p["sensitivity_kl"].size(), 5u);
    for (int l = 0; l < 5; ++l)
        EXPECT_GT(p["sensitivity_kl"][l].get<double>(), 0.0) << "layer " << l;
    auto order = p["sensitivity_order"].get<std::vector<int>>();
    for (size_t i = 1; i < order.size(); ++i) {
        EXPECT_GE(p["sensitivity_kl"][order[i - 1]].get<double>(),
                  p["sensitivity_kl"][order[i]].get<double>());
    }
    std::sort(order.begin(), order.end());
    EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
    // The observation layer: the first four layers each measured as the only full layer,
    // the one with the least decode KL chosen.
    const auto observer_kl = p["observer_kl"].get<std::vector<double>>();
    ASSERT_EQ(observer_kl.size(), 4u);
    for (double v : observer_kl) EXPECT_GT(v, 0.0);
    const int observer = p["observation_layer"];
    EXPECT_EQ(observer,
              std::min_element(observer_kl.begin(), observer_kl.end()) - observer_kl.begin());
    // The logit correction's statistics: per layer, one variance per KV head and RoPE pair;
    // the compressors are not exact, so none is zero.
    ASSERT_EQ(p["key_error_var"].size(), 5u);
    for (int l = 0; l < 5; ++l) {
        const auto var = p["key_error_var"][l].get<std::vector<double>>();
        ASSERT_EQ(var.size(), static_cast<size_t>(d / 4)) << "layer " << l;
        for (double v : var) EXPECT_GT(v, 0.0) << "layer " << l;
    }
    EXPECT_NE(r.err.find("[calibrate] key error measured on"), std::string::npos);

    // TRIM-KV gates were trained too, with progress, and start from retaining everything.
    EXPECT_NE(r.err.find("[trimkv] layer 5/5 epoch 2/2"), std::string::npos);
    std::ifstream tin(out_ + "/trimkv.json");
    const auto t = nlohmann::json::parse(tin);
    EXPECT_EQ(t["format"], "deltaserve-trimkv/1");
    EXPECT_EQ(t["layers"].size(), 5u);
    EXPECT_TRUE(fs::exists(out_ + "/trimkv.safetensors"));
    EXPECT_FALSE(fs::exists(out_ + "/trimkv_data"));

    // The safetensors header names every tensor with its shape.
    std::ifstream st(out_ + "/deltakv.safetensors", std::ios::binary);
    uint64_t n = 0;
    st.read(reinterpret_cast<char*>(&n), 8);
    std::string header(n, '\0');
    st.read(header.data(), static_cast<std::streamsize>(n));
    const auto h = nlohmann::json::parse(header);
    for (int layer = 0; layer < 5; ++layer) {
        const std::string pre = "layers." + std::to_string(layer) + ".";
        EXPECT_EQ(h[pre + "enc.w1"]["shape"], nlohmann::json({hidden, d}));
        EXPECT_EQ(h[pre + "enc.w2"]["shape"], nlohmann::json({hidden, d}));
        EXPECT_EQ(h[pre + "enc.w3"]["shape"], nlohmann::json({m, hidden}));
        EXPECT_EQ(h[pre + "dec.w"]["shape"], nlohmann::json({d, m}));
    }
}

TEST_F(CalibrateTest, MissingTextOrTrainerIsAClearError) {
    CliResult r = calibrate({"--text", "/no/such/text"});
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("cannot open calibration text /no/such/text"), std::string::npos)
        << r.describe();
    r = calibrate({"--python", "/no/such/python"});
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("the trainer failed"), std::string::npos) << r.describe();
    EXPECT_FALSE(fs::exists(out_ + "/kv")) << "the recorded KV is not left behind";
    r = calibrate({"--trimkv-seq", "0"});
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("--trimkv-seq"), std::string::npos) << r.describe();
    r = calibrate({"--stride", "0"});
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("--stride >= 1"), std::string::npos) << r.describe();
    r = calibrate({"--latent", "65"});  // stories260K: D = 64
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("--latent must be at most 64"), std::string::npos) << r.describe();
    EXPECT_FALSE(fs::exists(out_ + "/kv")) << "refused before anything is recorded";
}

// The end-to-end objective on the default model (GGUF: the JAX twin reads it): a few steps
// through the model's next-token loss lower the held-out loss of the MSE-trained start, and
// the engine loads the result.
TEST(CalibrateNtpTest, NextTokenFineTuneLowersTheHeldOutLoss) {
    DS_REQUIRE_FILE(default_gguf_model(), "default GGUF model");
    DS_REQUIRE_FILE(std::string(kText), "GPL-2 text (base-files)");
    const std::string jax_python = tools_python();
    DS_REQUIRE_FILE(jax_python, "Python with JAX (deploy/setup.sh makes .venv-tools)");
    const std::string out =
        (fs::temp_directory_path() / ("deltactl_ntp_" + std::to_string(::getpid()))).string();
    const CliResult r = run_binary(deltactl_binary(),
                                   {"calibrate",
                                    "--model",
                                    default_gguf_model(),
                                    "--text",
                                    kText,
                                    "--tokens",
                                    "1024",
                                    "--seq-len",
                                    "512",
                                    "--epochs",
                                    "1",
                                    "--steps",
                                    "deltakv",
                                    "--latent",
                                    "192",
                                    "--stride",
                                    "40",
                                    "--objective",
                                    "ntp",
                                    "--ntp-steps",
                                    "3",
                                    "--ntp-seq-len",
                                    "256",
                                    "--jax-python",
                                    jax_python,
                                    "--threads",
                                    "2",
                                    "--out",
                                    out},
                                   // A hang guard, not a time limit: beside the other tests
                                   // (CI's ctest -j2) it took 530 to 615 s.
                                   "", std::chrono::seconds(1200));
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    EXPECT_NE(r.err.find("[ntp] step 3/3"), std::string::npos) << "progress is shown";
    std::ifstream in(out + "/deltakv.json");
    const auto p = nlohmann::json::parse(in);
    EXPECT_EQ(p["objective"], "ntp");
    EXPECT_EQ(p["m"], 192) << "--latent, as setup calibrates the default model";
    EXPECT_EQ(p["stride"], 40);
    const double before = p["ntp"]["held_out_ntp_before"], after = p["ntp"]["held_out_ntp_after"];
    EXPECT_LT(after, before) << p["ntp"].dump();
    EXPECT_GT(after, p["ntp"]["held_out_ntp_full"].get<double>())
        << "compressed KV is not better than full";
    ASSERT_EQ(p["layers"].size(), 30u);
    for (const auto& l : p["layers"]) EXPECT_GT(l["relative_error"].get<double>(), 0.0) << l.dump();
    EXPECT_FALSE(fs::exists(out + "/ntp_tokens")) << "the token file is removed";

    // The fine-tuned profile serves: a short greedy generation with it runs.
    const CliResult g =
        run_binary(deltaserve_binary(),
                   {"generate", "--model", default_gguf_model(), "--prompt", "Once upon a time",
                    "--max-tokens", "8", "--temperature", "0", "--kv-policy", "deltakv",
                    "--kv-profile", out + "/deltakv.json", "--threads", "2"},
                   "", std::chrono::seconds(120));
    EXPECT_EQ(g.exit_code, 0) << g.describe();
    std::error_code ec;
    fs::remove_all(out, ec);
}

TEST_F(CalibrateTest, NtpObjectiveErrorsAreClear) {
    CliResult r = calibrate({"--objective", "ntp"});  // stories260K is a llama2.c checkpoint
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("--objective ntp needs a GGUF model"), std::string::npos) << r.describe();
    r = calibrate({"--objective", "best"});
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("--objective must be mse or ntp"), std::string::npos) << r.describe();
}

}  // namespace
}  // namespace deltaserve::testing
