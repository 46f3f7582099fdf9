// A model file whose tensors or keys ask for a graph deltaserve does not compute is refused
// naming what, never run wrong: the files of make_test_models.py's --only-bad set, one
// reason each (GGUF and Hugging Face directories).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "deltaserve/model/model.h"
#include "test_models.h"

namespace deltaserve::model {
namespace {

namespace fs = std::filesystem;

class ModelRefusal : public ::testing::Test {
  protected:
    void SetUp() override {
        DS_REQUIRE_TEST_MODEL_TOOLS();
        ASSERT_FALSE(dir().empty()) << testing::test_models(/*only_bad=*/true).why;
    }

    // Loading `name` fails with `code`, and the message says `says`.
    static void refused(const std::string& name, StatusCode code, const std::string& says) {
        LoadOptions lo;
        lo.show_progress = false;
        auto m = load_model(dir() + "/" + name, lo);
        ASSERT_FALSE(m.ok()) << name << " loaded";
        EXPECT_EQ(m.error().code(), code) << name << ": " << m.error().to_string();
        EXPECT_NE(m.error().message().find(says), std::string::npos)
            << name << ": " << m.error().to_string();
    }

    static const std::string& dir() { return testing::test_models(/*only_bad=*/true).dir; }
};

TEST_F(ModelRefusal, GgufTensorsNoPartOfTheModelUses) {
    refused("bad-unused-tensor.gguf", StatusCode::kUnimplemented, "'blk.0.attn_rot_embd'");
    refused("bad-extra-layer.gguf", StatusCode::kUnimplemented, "'blk.2.attn_norm.weight'");
    // llama.cpp's qwen3 graph has no rope_freqs either.
    refused("bad-qwen3-rope-freqs.gguf", StatusCode::kUnimplemented, "'rope_freqs.weight'");
}

TEST_F(ModelRefusal, GgufKeysThatChangeTheResult) {
    refused("bad-yarn.gguf", StatusCode::kUnimplemented, "qwen3.rope.scaling.type = yarn");
    refused("bad-scaling-type.gguf", StatusCode::kUnimplemented, "'ntk'");
    refused("bad-softcap.gguf", StatusCode::kUnimplemented,
            "qwen3.final_logit_softcapping: final logit softcapping");
    refused("bad-attn-softcap.gguf", StatusCode::kUnimplemented, "attn_logit_softcapping");
    refused("bad-sliding-window.gguf", StatusCode::kUnimplemented, "sliding-window attention");
    refused("bad-experts.gguf", StatusCode::kUnimplemented, "mixture of experts");
    refused("bad-unknown-key.gguf", StatusCode::kUnimplemented,
            "qwen3.attention.temperature_scale: a key deltaserve does not implement");
    refused("bad-qwen3moe.gguf", StatusCode::kUnimplemented, "'qwen3moe'");
}

TEST_F(ModelRefusal, GgufHostileValues) {
    refused("bad-factor-nan.gguf", StatusCode::kInvalidArgument, "not finite");
    refused("bad-rope-freqs-nan.gguf", StatusCode::kInvalidArgument, "rope_freqs.weight holds nan");
    refused("bad-rope-freqs-shape.gguf", StatusCode::kInvalidArgument,
            "'rope_freqs.weight' has shape [9], expected [8]");
}

TEST_F(ModelRefusal, HuggingFaceOptionsThatChangeTheResult) {
    refused("hf-bad-yarn", StatusCode::kUnimplemented, "rope_scaling of type 'yarn'");
    refused("hf-bad-dynamic", StatusCode::kUnimplemented, "rope_scaling of type 'dynamic'");
    refused("hf-bad-partial-rotary", StatusCode::kUnimplemented, "partial_rotary_factor");
    refused("hf-bad-softcap", StatusCode::kUnimplemented, "final_logit_softcapping");
    refused("hf-bad-experts", StatusCode::kUnimplemented, "num_experts 8");
    refused("hf-bad-unused-tensor", StatusCode::kUnimplemented,
            "'model.layers.0.mlp.gate_proj.scales' is not used");
    refused("hf-bad-llama3-span", StatusCode::kInvalidArgument,
            "high_freq_factor must exceed low_freq_factor");
}

}  // namespace
}  // namespace deltaserve::model
