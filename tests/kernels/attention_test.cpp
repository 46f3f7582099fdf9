// The blocked attention kernel against the straightforward reference, over the shapes the
// forward pass produces: prefill chunks, decode steps, long contexts split over threads.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "deltaserve/common/fp16.h"
#include "deltaserve/kernels/attention.h"

namespace deltaserve::kernels {
namespace {

struct Case {
    int n_heads, n_kv_heads, head_dim;
    int32_t n_past, n_q;
    DType dtype;
};

class AttentionTest : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionTest, MatchesReference) {
    const Case c = GetParam();
    const int32_t n = c.n_past + c.n_q;
    const int kv_dim = c.n_kv_heads * c.head_dim;
    const size_t elem = c.dtype == DType::kF16 ? 2 : 4;
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    // Slots in shuffled order, as a pool shared by several sequences would hand out.
    std::vector<int32_t> slots(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) slots[i] = i;
    std::shuffle(slots.begin(), slots.end(), rng);
    std::vector<uint8_t> k(static_cast<size_t>(n) * kv_dim * elem), v(k.size());
    for (size_t i = 0; i < static_cast<size_t>(n) * kv_dim; ++i) {
        const float a = nd(rng) * 2.0f, b = nd(rng);
        if (c.dtype == DType::kF16) {
            reinterpret_cast<uint16_t*>(k.data())[i] = fp32_to_fp16(a);
            reinterpret_cast<uint16_t*>(v.data())[i] = fp32_to_fp16(b);
        } else {
            reinterpret_cast<float*>(k.data())[i] = a;
            reinterpret_cast<float*>(v.data())[i] = b;
        }
    }
    KvView view{c.dtype, k.data(), v.data(), kv_dim * elem, slots.data(), n};
    const int q_dim = c.n_heads * c.head_dim;
    std::vector<float> q(static_cast<size_t>(c.n_q) * q_dim);
    for (auto& x : q) x = nd(rng);
    AttentionShape shape{c.n_heads, c.n_kv_heads, c.head_dim, 1.0f / std::sqrt(float(c.head_dim))};

    std::vector<float> got(q.size(), -1.0f), want(q.size(), -2.0f);
    ThreadPool pool(2);
    attention(shape, view, q.data(), q_dim, c.n_q, c.n_past, got.data(), q_dim, pool);
    attention_reference(shape, view, q.data(), q_dim, c.n_q, c.n_past, want.data(), q_dim);
    double max_err = 0;
    for (size_t i = 0; i < got.size(); ++i) max_err = std::max(max_err, double(std::fabs(got[i] - want[i])));
    EXPECT_LT(max_err, 2e-5);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionTest,
    ::testing::Values(Case{8, 4, 8, 0, 1, DType::kF32},       // stories260K, first token
                      Case{9, 3, 64, 0, 37, DType::kF16},     // SmolLM2 prompt
                      Case{9, 3, 64, 100, 50, DType::kF16},   // a second chunk
                      Case{9, 3, 64, 2000, 1, DType::kF16},   // decode, split over keys
                      Case{9, 3, 64, 700, 3, DType::kF32},    // a few queries, split
                      Case{4, 4, 128, 33, 17, DType::kF16},   // MHA, wide heads
                      Case{32, 8, 64, 0, 70, DType::kF32}));  // GQA 4:1, several blocks

}  // namespace
}  // namespace deltaserve::kernels
