// DeltaKV in the real forward pass (SmolLM2 with the profile setup calibrates): the first
// call sees every token uncompressed, so its logits equal full KV's; later the cache holds
// about the keep ratio and decoding stays close to full KV.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "default_model.h"
#include "deltaserve/model/inference_context.h"
#include "deltaserve/model/sampler.h"
#include "deltaserve/model/scoring.h"
#include "test_paths.h"

namespace deltaserve::model {
namespace {

class DeltaKvModelTest : public testing::DefaultModelTest {
  protected:
    static Result<std::unique_ptr<InferenceContext>> context(
        const std::string& policy, float keep, float select = ContextOptions{}.deltakv_select,
        int32_t score_every = 0, float score_dims = 0.25f,
        float pin = ContextOptions{}.deltakv_pin) {
        ContextOptions co;
        co.deltakv_pin = pin;
        co.deltakv_select = select;
        co.deltakv_score_every = score_every;
        co.deltakv_score_dims = score_dims;
        co.n_ctx = 2048;
        co.n_threads = 2;
        co.kv.policy = policy;
        co.kv.keep = keep;
        co.kv_profile = testing::default_deltakv_profile();
        return InferenceContext::create(*model_, co);
    }
};

TEST_F(DeltaKvModelTest, FirstCallExactThenCompressedAndClose) {
    auto full = context("full", 1.0f);
    auto dkv = context("deltakv", 0.3f);
    ASSERT_TRUE(full.ok() && dkv.ok()) << dkv.error().to_string();
    const auto tokens = text_tokens(1400);
    ASSERT_EQ(tokens.size(), 1400u);
    const std::span<const int32_t> first(tokens.data(), 400);
    auto a = (*full)->eval(first);
    auto b = (*dkv)->eval(first);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(std::vector<float>(a->begin(), a->end()), std::vector<float>(b->begin(), b->end()));
    // The rest in chunks, each attending to the compressed history; then the text one token
    // at a time (decode steps), over enough positions that one token more or less does not
    // decide the test. Greedy agreement alone would pass even broken compressors (the local
    // context predicts most tokens), so the decode steps' KL to full KV is bounded too.
    int agree = 0, steps = 0;
    double kl = 0;
    for (size_t at = 400; at < 1200; at += 200) {
        const std::span<const int32_t> chunk(tokens.data() + at, 200);
        a = (*full)->eval(chunk);
        b = (*dkv)->eval(chunk);
        ASSERT_TRUE(a.ok() && b.ok());
        agree += greedy(*a) == greedy(*b);
        ++steps;
    }
    for (size_t t = 1200; t < tokens.size(); ++t, ++steps) {
        a = (*full)->eval(std::span<const int32_t>(&tokens[t], 1));
        b = (*dkv)->eval(std::span<const int32_t>(&tokens[t], 1));
        ASSERT_TRUE(a.ok() && b.ok());
        for (float x : *b) ASSERT_TRUE(std::isfinite(x));
        agree += greedy(*a) == greedy(*b);
        std::vector<double> la, lb;
        log_softmax(a->data(), static_cast<int32_t>(a->size()), la);
        log_softmax(b->data(), static_cast<int32_t>(b->size()), lb);
        kl += kl_divergence(la, lb);
    }
    kl /= static_cast<double>(tokens.size() - 1200);
    std::printf("decode steps: mean KL to full KV %.4f, greedy agreement %d/%d\n", kl, agree,
                steps);
    EXPECT_GE(agree, steps * 2 / 3) << agree << "/" << steps;
    // Setup's profile: 0.10 at the default selection (10% and the pins; 0.11 at 20% without
    // pins); with its decoders zeroed (the reference mean alone) 0.17, with their weights
    // shuffled 0.23 (both measured at 20% without pins).
    EXPECT_LT(kl, 0.14) << "mean KL to full KV over the decode steps";
    EXPECT_LE((*dkv)->keep_ratio(), 0.33);
    EXPECT_GT((*dkv)->keep_ratio(), 0.15);
}

// Teacher-forced decode steps after a compressed history: attending to (and reconstructing)
// all of it comes closer to full KV than a small selection, at the same memory; so does a
// selection of the same size made by scorer layers.
TEST_F(DeltaKvModelTest, ALargerDecodeSelectionIsCloserToFullKv) {
    const auto tokens = text_tokens(1000);
    const size_t prompt = 900;
    std::vector<double> kl, kr;
    // The mean KL to full KV of the decode steps after the prompt, and the keep ratio reached.
    const auto decode_kl = [&](float select, int32_t score_every, double* keep_ratio,
                               float score_dims = 0.25f) {
        auto full = context("full", 1.0f);
        auto dkv = context("deltakv", 0.3f, select, score_every, score_dims);
        EXPECT_TRUE(full.ok() && dkv.ok()) << dkv.error().to_string();
        if (!full.ok() || !dkv.ok()) return -1.0;
        EXPECT_TRUE((*full)->eval(std::span<const int32_t>(tokens.data(), prompt)).ok());
        EXPECT_TRUE((*dkv)->eval(std::span<const int32_t>(tokens.data(), prompt)).ok());
        double sum = 0;
        for (size_t t = prompt; t < tokens.size(); ++t) {
            auto a = (*full)->eval(std::span<const int32_t>(&tokens[t], 1));
            auto b = (*dkv)->eval(std::span<const int32_t>(&tokens[t], 1));
            EXPECT_TRUE(a.ok() && b.ok());
            if (!a.ok() || !b.ok()) return -1.0;
            std::vector<double> la, lb;
            log_softmax(a->data(), static_cast<int32_t>(a->size()), la);
            log_softmax(b->data(), static_cast<int32_t>(b->size()), lb);
            sum += kl_divergence(la, lb);
        }
        *keep_ratio = (*dkv)->keep_ratio();
        return sum / static_cast<double>(tokens.size() - prompt);
    };
    for (float select : {0.05f, 1.0f}) {
        kr.push_back(0.0);
        kl.push_back(decode_kl(select, 0, &kr.back()));
    }
    EXPECT_EQ(kr[0], kr[1]) << "the selection does not change what is held";
    EXPECT_LT(kl[1], kl[0]) << "KL to full: select 0.05 " << kl[0] << ", select 1.0 " << kl[1];
    auto bad = context("deltakv", 0.3f, 0.0f);
    EXPECT_FALSE(bad.ok());
    // Scorer layers: each scores with its own keys what the layers up to the next attend,
    // the same 20% share, closer to full KV than the observation layer's pick, whether it
    // picks by a sketch of a quarter of the key dimensions (the default) or by whole keys
    // (setup's profile: 0.038 and 0.033 against 0.069 with the pins, 0.115 without).
    double kr_paper = 0, kr_scored = 0, kr_whole = 0;
    const double paper = decode_kl(0.2f, 0, &kr_paper);
    const double scored = decode_kl(0.2f, 3, &kr_scored);
    const double whole = decode_kl(0.2f, 3, &kr_whole, 1.0f);
    EXPECT_EQ(kr_paper, kr_scored) << "the pick does not change what is held";
    EXPECT_EQ(kr_paper, kr_whole);
    EXPECT_GE(paper, 0.0);
    EXPECT_GE(scored, 0.0);
    EXPECT_GE(whole, 0.0);
    EXPECT_LT(scored, paper) << "KL to full: observation layer's pick " << paper << ", scorers' "
                             << scored;
    EXPECT_LT(whole, paper) << "KL to full: observation layer's pick " << paper << ", whole keys' "
                            << whole;
    std::printf(
        "decode KL to full KV: observation layer's pick %.4f, scorers every 3 %.4f (whole keys "
        "%.4f)\n",
        paper, scored, whole);
    EXPECT_FALSE(context("deltakv", 0.3f, 0.2f, -1).ok());
    EXPECT_FALSE(context("deltakv", 0.3f, 0.2f, 3, 0.0f).ok());
}

// What a user asks of a long prompt: a pass key in the middle of 1800 tokens of text, then
// the question; the answer's digits after the first come from decode steps, which attend
// only a share of the compressed history. With the tokens the question attended pinned
// (the default) DeltaKV answers as full KV does; with the observation layer's pick alone
// (pins off) it loses the key after the first digit (setup's profile: answer log-likelihood
// -3.9 against full KV's -3.4, and -17.6 without pins).
TEST_F(DeltaKvModelTest, DecodeStepsRecallAPassKeyFromTheCompressedHistory) {
    const auto tok = [&](const std::string& s) {
        return *model_->tokenizer->encode(s, false, false);
    };
    std::vector<int32_t> prompt = text_tokens(900);
    const auto needle = tok(" The pass key is 73914. Remember it. 73914 is the pass key. ");
    prompt.insert(prompt.end(), needle.begin(), needle.end());
    const auto more = text_tokens(900, 900);
    prompt.insert(prompt.end(), more.begin(), more.end());
    const auto question = tok("\nWhat is the pass key? The pass key is");
    prompt.insert(prompt.end(), question.begin(), question.end());
    const auto answer = tok(" 73914");
    ASSERT_GE(answer.size(), 3u);
    // The answer teacher-forced, one token at a time after the prompt: its log-likelihood,
    // and how many of its tokens were the argmax.
    const auto recall = [&](InferenceContext& ctx, int* exact) {
        auto l = ctx.eval(prompt);
        EXPECT_TRUE(l.ok());
        double ll = 0;
        *exact = 0;
        std::vector<double> lp;
        for (size_t i = 0; l.ok() && i < answer.size(); ++i) {
            log_softmax(l->data(), static_cast<int32_t>(l->size()), lp);
            ll += lp[answer[i]];
            *exact += greedy(*l) == answer[i];
            if (i + 1 < answer.size()) l = ctx.eval(std::span<const int32_t>(&answer[i], 1));
        }
        return ll;
    };
    auto full = context("full", 1.0f);
    auto pinned = context("deltakv", 0.3f);
    auto unpinned = context("deltakv", 0.3f, ContextOptions{}.deltakv_select, 0, 0.25f, 0.0f);
    ASSERT_TRUE(full.ok() && pinned.ok() && unpinned.ok());
    int exact_full = 0, exact_pinned = 0, exact_unpinned = 0;
    const double ll_full = recall(**full, &exact_full);
    const double ll_pinned = recall(**pinned, &exact_pinned);
    const double ll_unpinned = recall(**unpinned, &exact_unpinned);
    std::printf("pass key log-likelihood: full KV %.2f, DeltaKV %.2f, without pins %.2f\n", ll_full,
                ll_pinned, ll_unpinned);
    // Full KV gets every digit (the model may start the answer otherwise than with a space).
    ASSERT_GE(exact_full, static_cast<int>(answer.size()) - 1) << "full KV recalls the key";
    EXPECT_GE(exact_pinned, exact_full) << "DeltaKV recalls it as full KV does";
    EXPECT_GT(ll_pinned, ll_full - 1.0);
    EXPECT_GT(ll_pinned, ll_unpinned + 5.0);
    EXPECT_LE((*pinned)->keep_ratio(), 0.33);
    EXPECT_FALSE(context("deltakv", 0.3f, 0.2f, 0, 0.25f, 1.0f).ok())
        << "pin ratio must be below 1";
}

// A server feeds a long prompt in chunks between other sessions' steps. Told that more of
// the prompt follows (expect_more), DeltaKV keeps it exact and compresses it at its last
// chunk, as it does a prompt given in one call: every chunk's logits are full KV's, bit for
// bit, and no chunk reconstructs what an earlier one compressed.
TEST_F(DeltaKvModelTest, APromptFedInChunksIsCompressedAtItsLastChunk) {
    const auto prompt = text_tokens(1200);
    auto full = context("full", 1.0f);
    auto one = context("deltakv", 0.3f);
    auto chunked = context("deltakv", 0.3f);
    ASSERT_TRUE(full.ok() && one.ok() && chunked.ok());
    ASSERT_TRUE((*one)->eval(prompt).ok());
    constexpr size_t kChunk = 100;
    for (size_t at = 0; at < prompt.size(); at += kChunk) {
        const std::span<const int32_t> piece(prompt.data() + at, kChunk);
        (*chunked)->expect_more(static_cast<int32_t>(prompt.size() - at - kChunk));
        auto a = (*full)->eval(piece);
        auto b = (*chunked)->eval(piece);
        ASSERT_TRUE(a.ok() && b.ok());
        ASSERT_EQ(std::vector<float>(a->begin(), a->end()),
                  std::vector<float>(b->begin(), b->end()))
            << "the chunk at " << at << " attends the prompt exact";
        if (at + kChunk < prompt.size())
            EXPECT_GE((*chunked)->keep_ratio(), 1.0) << "chunk at " << at;
    }
    EXPECT_LE((*chunked)->keep_ratio(), 0.33);
    EXPECT_EQ((*chunked)->kv_bytes(), (*one)->kv_bytes()) << "compressed as the one-call prompt";
}

TEST_F(DeltaKvModelTest, MissingOrForeignProfileIsAClearError) {
    ContextOptions co;
    co.kv.policy = "deltakv";
    co.kv.keep = 0.3f;
    auto r = InferenceContext::create(*model_, co);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message().find("--kv-profile"), std::string::npos);
    co.kv_profile = "/no/such/deltakv.json";
    r = InferenceContext::create(*model_, co);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code(), StatusCode::kNotFound);
}

TEST_F(DeltaKvModelTest, ProfileWithNonFiniteWeightsIsAClearError) {
    // A copy of the default profile whose last weight is NaN (little-endian fp32).
    const std::filesystem::path src(testing::default_deltakv_profile());
    const auto dir =
        std::filesystem::temp_directory_path() / ("deltakv_nan_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    std::filesystem::copy_file(src, dir / "deltakv.json",
                               std::filesystem::copy_options::overwrite_existing);
    const auto weights = dir / "deltakv.safetensors";
    std::filesystem::copy_file(src.parent_path() / "deltakv.safetensors", weights,
                               std::filesystem::copy_options::overwrite_existing);
    {
        std::fstream f(weights, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(-4, std::ios::end);
        const unsigned char nan[4] = {0x00, 0x00, 0xc0, 0x7f};
        f.write(reinterpret_cast<const char*>(nan), 4);
    }
    ContextOptions co;
    co.kv.policy = "deltakv";
    co.kv.keep = 0.3f;
    co.kv_profile = (dir / "deltakv.json").string();
    auto r = InferenceContext::create(*model_, co);
    std::filesystem::remove_all(dir);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message().find("NaN"), std::string::npos) << r.error().message();
}

// A copy of the default profile's weights in a temporary folder, with its settings parsed,
// for tests that write a broken deltakv.json beside them; removed with the object.
struct ScratchProfile {
    explicit ScratchProfile(const std::string& tag)
        : dir(std::filesystem::temp_directory_path() / (tag + "_" + std::to_string(::getpid()))) {
        const std::filesystem::path src(testing::default_deltakv_profile());
        std::filesystem::create_directories(dir);
        std::filesystem::copy_file(src.parent_path() / "deltakv.safetensors",
                                   dir / "deltakv.safetensors",
                                   std::filesystem::copy_options::overwrite_existing);
        std::ifstream in(src);
        good = nlohmann::json::parse(in);
    }
    ~ScratchProfile() {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
    }
    void write(const nlohmann::json& j) const { std::ofstream(dir / "deltakv.json") << j.dump(); }
    std::string json_path() const { return (dir / "deltakv.json").string(); }

    std::filesystem::path dir;
    nlohmann::json good;
};

TEST_F(DeltaKvModelTest, ProfileWithMalformedKeyErrorsIsAClearError) {
    // key_error_var: one list per layer, each empty or n_kv_heads x head_dim / 2 variances.
    const ScratchProfile scratch("deltakv_kerr");
    const int32_t n_layers = model_->config.n_layers, per = model_->config.kv_dim() / 2;
    nlohmann::json layers = nlohmann::json::array();
    for (int32_t l = 0; l < n_layers; ++l)
        layers.push_back(std::vector<float>(l == 0 ? 0 : per, 0.01f));
    auto wrong_count = layers;
    wrong_count.erase(wrong_count.begin());
    auto wrong_size = layers;
    wrong_size[1] = std::vector<float>(3, 0.01f);
    auto negative = layers;
    negative[2][0] = -1.0f;
    auto not_numbers = layers;
    not_numbers[3][0] = "x";
    ContextOptions co;
    co.kv.policy = "deltakv";
    co.kv.keep = 0.3f;
    co.kv_profile = scratch.json_path();
    for (const auto& [name, value] : {std::pair{"valid", layers},
                                      {"a list missing", wrong_count},
                                      {"a short list", wrong_size},
                                      {"negative", negative},
                                      {"not numbers", not_numbers}}) {
        SCOPED_TRACE(name);
        auto j = scratch.good;
        j["key_error_var"] = value;
        scratch.write(j);
        auto r = InferenceContext::create(*model_, co);
        if (std::string(name) == "valid") {
            EXPECT_TRUE(r.ok()) << r.error().to_string();
            continue;
        }
        ASSERT_FALSE(r.ok());
        EXPECT_EQ(r.error().code(), StatusCode::kInvalidArgument);
        EXPECT_NE(r.error().message().find("key_error_var"), std::string::npos)
            << r.error().message();
    }
}

TEST_F(DeltaKvModelTest, ProfileWithSettingsOutOfRangeIsAClearError) {
    // A profile's numbers are read before anything divides by them or sizes a buffer.
    const ScratchProfile scratch("deltakv_range");
    ContextOptions co;
    co.kv.policy = "deltakv";
    co.kv.keep = 0.3f;
    co.kv_profile = scratch.json_path();
    for (const auto& [field, value] : {std::pair{"stride", 0},
                                       {"k", 0},
                                       {"m", 0},
                                       {"m", 100000},
                                       {"D", 100},
                                       {"window", 0},
                                       {"sinks", -1},
                                       {"latent_bits", 3}}) {
        SCOPED_TRACE(std::string(field) + " = " + std::to_string(value));
        auto j = scratch.good;
        j[field] = value;
        scratch.write(j);
        auto r = InferenceContext::create(*model_, co);
        ASSERT_FALSE(r.ok());
        EXPECT_EQ(r.error().code(), StatusCode::kInvalidArgument);
        EXPECT_NE(r.error().message().find("out of range"), std::string::npos)
            << r.error().message();
    }
    // The observation layer calibration measured must be a layer of the model.
    for (const nlohmann::json& value :
         {nlohmann::json(30), nlohmann::json(-2), nlohmann::json("3")}) {
        SCOPED_TRACE("observation_layer = " + value.dump());
        auto j = scratch.good;
        j["observation_layer"] = value;
        scratch.write(j);
        auto r = InferenceContext::create(*model_, co);
        ASSERT_FALSE(r.ok());
        EXPECT_EQ(r.error().code(), StatusCode::kInvalidArgument);
        const std::string& why = r.error().message();
        EXPECT_TRUE(why.find("observation_layer") != std::string::npos ||
                    why.find("must be number") != std::string::npos)
            << why;
    }
    scratch.write(scratch.good);
    EXPECT_TRUE(InferenceContext::create(*model_, co).ok());
}

}  // namespace
}  // namespace deltaserve::model
