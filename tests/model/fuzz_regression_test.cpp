// Inputs the fuzzers (tests/fuzz) found stopping the process, kept in tests/data/fuzz/:
// each is now refused with an error naming the problem, or loads and is refused when a
// context is made for it.
#include <gtest/gtest.h>

#include <string>

#include "deltaserve/model/inference_context.h"
#include "deltaserve/model/model.h"
#include "test_paths.h"

namespace deltaserve::model {
namespace {

std::string input(const std::string& name) { return testing::test_data_dir() + "/fuzz/" + name; }

LoadOptions quiet() {
    LoadOptions lo;
    lo.show_progress = false;
    return lo;
}

void expect_refused(const Result<std::unique_ptr<Model>>& m, StatusCode code,
                    const std::string& says) {
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.error().code(), code) << m.error().to_string();
    EXPECT_NE(m.error().message().find(says), std::string::npos) << m.error().to_string();
}

// Loads, but the attention kernels take head sizes in multiples of 8: the context is refused
// (it used to abort at the first token, in attention()).
void expect_context_refused(const Result<std::unique_ptr<Model>>& m) {
    ASSERT_TRUE(m.ok()) << m.error().to_string();
    EXPECT_EQ((*m)->config.head_dim, 4);
    ContextOptions co;
    co.n_ctx = 8;
    co.n_threads = 1;
    auto ctx = InferenceContext::create(**m, co);
    ASSERT_FALSE(ctx.ok());
    EXPECT_EQ(ctx.error().code(), StatusCode::kUnimplemented);
    EXPECT_NE(ctx.error().message().find("head size 4"), std::string::npos)
        << ctx.error().to_string();
}

TEST(FuzzRegression, GgufWithZeroKvHeadsIsRefused) {
    // Used to abort: value() on the error of the head_count_kv range check.
    expect_refused(load_gguf_model(input("gguf/head-count-kv-zero.gguf"), quiet()),
                   StatusCode::kInvalidArgument, "head_count_kv = 0");
}

TEST(FuzzRegression, GgufClaimingAHugeBlockCountIsRefusedWithoutAllocatingForIt) {
    // Used to allocate 2^30 layers' weights up front (200 GB) before finding the tensors.
    expect_refused(load_gguf_model(input("gguf/block-count-2e30.gguf"), quiet()),
                   StatusCode::kNotFound, "blk.1.");
}

TEST(FuzzRegression, GgufTensorOffsetThatWrapsAroundIsRefused) {
    // Used to pass the bounds check (data start + offset wrapped past 2^64) and point the
    // tensor's data before the mapping (UBSan: pointer overflow).
    expect_refused(load_gguf_model(input("gguf/tensor-offset-wraps.gguf"), quiet()),
                   StatusCode::kDataLoss, "lies outside the file");
}

TEST(FuzzRegression, ModelsWithHeadsTheKernelsCannotRunAreRefused) {
    expect_context_refused(load_gguf_model(input("gguf/head-dim-4.gguf"), quiet()));
    expect_context_refused(load_llama2c_model(input("llama2c/head-dim-4.bin"), quiet()));
    expect_context_refused(load_hf_model(input("hf-head-dim-4"), quiet()));
}

TEST(FuzzRegression, Llama2cVocabularyOfIntMinIsRefused) {
    // Used to negate INT32_MIN (undefined behaviour; UBSan stopped the process).
    expect_refused(load_llama2c_model(input("llama2c/vocab-int-min.bin"), quiet()),
                   StatusCode::kInvalidArgument, "implausible header");
}

}  // namespace
}  // namespace deltaserve::model
