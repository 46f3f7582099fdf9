// The blocked attention kernel against the straightforward reference, over the shapes the
// forward pass produces: prefill chunks, decode steps, long contexts split over threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "deltaserve/common/fp16.h"
#include "deltaserve/kernels/attention.h"
#include "deltaserve/kernels/attention_scores.h"
#include "deltaserve/kernels/attention_support.h"

namespace deltaserve::kernels {
namespace {

struct Case {
    int n_heads, n_kv_heads, head_dim;
    int32_t n_past, n_q;
    DType dtype;
};

// Random K, V (in shuffled slots) and queries for a case.
struct Inputs {
    std::vector<int32_t> slots;
    std::vector<uint8_t> k, v;
    std::vector<float> q;
    KvView view;
    AttentionShape shape;
    int q_dim = 0;
};

Inputs make_inputs(const Case& c) {
    Inputs in;
    const int32_t n = c.n_past + c.n_q;
    const int kv_dim = c.n_kv_heads * c.head_dim;
    const size_t elem = c.dtype == DType::kF16 ? 2 : 4;
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    // Slots in shuffled order, as a pool shared by several sequences would hand out.
    std::vector<int32_t>& slots = in.slots;
    slots.resize(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) slots[i] = i;
    std::shuffle(slots.begin(), slots.end(), rng);
    std::vector<uint8_t>& k = in.k;
    std::vector<uint8_t>& v = in.v;
    k.resize(static_cast<size_t>(n) * kv_dim * elem);
    v.resize(k.size());
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
    in.view =
        KvView{c.dtype, k.data(), v.data(), kv_dim * elem, slots.data(), n, c.head_dim * elem};
    in.q_dim = c.n_heads * c.head_dim;
    in.q.resize(static_cast<size_t>(c.n_q) * in.q_dim);
    for (auto& x : in.q) x = nd(rng);
    in.shape =
        AttentionShape{c.n_heads, c.n_kv_heads, c.head_dim, 1.0f / std::sqrt(float(c.head_dim))};
    return in;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    double m = 0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, double(std::fabs(a[i] - b[i])));
    return m;
}

class AttentionTest : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionTest, MatchesReference) {
    const Case c = GetParam();
    const Inputs in = make_inputs(c);
    const auto& [slots, k, v, q, view, shape, q_dim] = in;
    std::vector<float> got(q.size(), -1.0f), want(q.size(), -2.0f);
    ThreadPool pool(2);
    attention(shape, view, q.data(), q_dim, c.n_q, got.data(), q_dim, pool);
    attention_reference(shape, view, q.data(), q_dim, c.n_q, want.data(), q_dim);
    EXPECT_LT(max_abs_diff(got, want), 2e-5);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionTest,
    ::testing::Values(Case{8, 4, 8, 0, 1, DType::kF32},      // stories260K, first token
                      Case{9, 3, 64, 0, 37, DType::kF16},    // SmolLM2 prompt
                      Case{9, 3, 64, 100, 50, DType::kF16},  // a second chunk
                      Case{9, 3, 64, 2000, 1, DType::kF16},  // decode, split over keys
                      Case{9, 3, 64, 700, 3, DType::kF32},   // a few queries, split
                      Case{4, 4, 128, 33, 17, DType::kF16},  // MHA, wide heads
                      Case{32, 8, 64, 0, 70, DType::kF32},   // GQA 4:1, several blocks
                      // Head sizes past 64 that are not multiples of it: the values' last
                      // chunks go as 4 + 2 (112) and 4 + 1 (104), decoding and in a chunk.
                      Case{4, 2, 112, 300, 1, DType::kF16}, Case{4, 2, 112, 20, 33, DType::kF16},
                      Case{4, 2, 104, 300, 1, DType::kF16}, Case{4, 2, 104, 20, 33, DType::kF16}));

// Shapes the kernels cannot take are refused with a reason before a context is made (the
// model's context asks), never found out by the kernels' checks.
TEST(AttentionShapes, WhatTheKernelsCannotTakeIsRefusedWithTheReason) {
    EXPECT_TRUE(attention_shape_supported({64, 64, 64, 0.125f}).ok());
    const auto expect_refused = [](const AttentionShape& s, const char* why) {
        const Status st = attention_shape_supported(s);
        EXPECT_EQ(st.code(), StatusCode::kUnimplemented) << why;
        EXPECT_NE(st.message().find(why), std::string::npos) << st.to_string();
    };
    expect_refused({65, 65, 64, 0.125f}, "65 KV heads");
    expect_refused({8, 8, 12, 0.125f}, "head size 12");
    expect_refused({9, 2, 64, 0.125f}, "9 query heads over 2 KV heads");
    expect_refused({98, 2, 64, 0.125f}, "49 query heads per KV head");
}

// Without the causal mask every query sees every entry: the same as each query alone
// (a single query sees the whole view), with the same log-sum-exp.
TEST(AttentionNoMask, EveryQuerySeesEveryEntry) {
    for (const Case& c : {Case{9, 3, 64, 40, 37, DType::kF16}, Case{9, 3, 64, 300, 70, DType::kF16},
                          Case{8, 4, 8, 5, 3, DType::kF32}}) {
        const Inputs in = make_inputs(c);
        const auto& [slots, k, v, q, view, shape, q_dim] = in;
        std::vector<float> got(q.size(), -1.0f), want(q.size(), -2.0f);
        std::vector<float> lse(static_cast<size_t>(c.n_q) * c.n_heads), lse_want(lse.size());
        ThreadPool pool(2);
        attention(shape, view, q.data(), q_dim, c.n_q, got.data(), q_dim, pool, lse.data(), false);
        for (int32_t i = 0; i < c.n_q; ++i) {
            attention(shape, view, q.data() + i * q_dim, q_dim, 1, want.data() + i * q_dim, q_dim,
                      pool, lse_want.data() + i * c.n_heads);
        }
        EXPECT_LT(max_abs_diff(got, want), 2e-5) << c.n_past << " + " << c.n_q;
        EXPECT_LT(max_abs_diff(lse, lse_want), 1e-4) << c.n_past << " + " << c.n_q;
    }
}

// Per-head lists (a cache that keeps different tokens per KV head, one head per row): each
// head attends exactly its own entries. Built from a shared-row case by copying head g of
// the kept tokens into rows of its own; the kept sets differ per head and include every
// new token.
TEST(AttentionPerHead, EachHeadReadsItsOwnEntries) {
    const Case c{9, 3, 64, 300, 5, DType::kF16};
    const Inputs in = make_inputs(c);
    const int32_t n = c.n_past + c.n_q;
    const size_t head_bytes = c.head_dim * 2;
    std::mt19937 rng(11);
    std::vector<std::vector<int32_t>> kept(c.n_kv_heads);  // entries of the shared view
    std::vector<uint8_t> hk, hv;                           // one head per row
    std::vector<std::vector<int32_t>> head_slots(c.n_kv_heads);
    for (int g = 0; g < c.n_kv_heads; ++g) {
        for (int32_t i = 0; i < n; ++i) {
            if (i >= c.n_past || rng() % 3 != 0) kept[g].push_back(i);
        }
        for (int32_t e : kept[g]) {
            const size_t src =
                static_cast<size_t>(in.slots[e]) * in.view.row_stride + g * head_bytes;
            head_slots[g].push_back(static_cast<int32_t>(hk.size() / head_bytes));
            hk.insert(hk.end(), in.k.begin() + src, in.k.begin() + src + head_bytes);
            hv.insert(hv.end(), in.v.begin() + src, in.v.begin() + src + head_bytes);
        }
    }
    std::vector<const int32_t*> lists;
    std::vector<int32_t> counts;
    for (const auto& l : head_slots) {
        lists.push_back(l.data());
        counts.push_back(static_cast<int32_t>(l.size()));
    }
    KvView per_head{DType::kF16, hk.data(), hv.data(),    head_bytes,   nullptr,
                    0,           0,         lists.data(), counts.data()};

    ThreadPool pool(2);
    std::vector<float> got(in.q.size()), want(in.q.size()), dense(in.q.size());
    attention(in.shape, per_head, in.q.data(), in.q_dim, c.n_q, got.data(), in.q_dim, pool);
    attention_reference(in.shape, per_head, in.q.data(), in.q_dim, c.n_q, want.data(), in.q_dim);
    EXPECT_LT(max_abs_diff(got, want), 2e-5);
    // Head g alone, through a shared view listing the same tokens, gives the same output.
    const int group = c.n_heads / c.n_kv_heads;
    for (int g = 0; g < c.n_kv_heads; ++g) {
        std::vector<int32_t> shared;
        for (int32_t e : kept[g]) shared.push_back(in.slots[e]);
        KvView one = in.view;
        one.slots = shared.data();
        one.n = static_cast<int32_t>(shared.size());
        attention_reference(in.shape, one, in.q.data(), in.q_dim, c.n_q, dense.data(), in.q_dim);
        for (int32_t i = 0; i < c.n_q; ++i) {
            for (int d = 0; d < group * c.head_dim; ++d) {
                const size_t at = static_cast<size_t>(i) * in.q_dim + g * group * c.head_dim + d;
                ASSERT_NEAR(got[at], dense[at], 2e-5) << "head group " << g;
            }
        }
    }
}

// The attention statistics the eviction policies use equal a direct softmax per query.
TEST(AttentionColumnSums, MatchDirectSoftmax) {
    const Case c{9, 3, 64, 40, 12, DType::kF16};
    const Inputs in = make_inputs(c);
    const int group = c.n_heads / c.n_kv_heads;
    const int32_t n = c.n_past + c.n_q;
    for (int power : {1, 2}) {
        for (int32_t first : {0, 9}) {
            std::vector<std::vector<float>> got(c.n_kv_heads, std::vector<float>(n, 0.0f));
            std::vector<float*> ptrs;
            for (auto& g : got) ptrs.push_back(g.data());
            ThreadPool pool(2);
            attention_column_sums(in.shape, in.view, in.q.data(), in.q_dim, c.n_q, first, power,
                                  ptrs.data(), pool);
            for (int g = 0; g < c.n_kv_heads; ++g) {
                std::vector<double> want(n, 0.0);
                for (int32_t i = first; i < c.n_q; ++i) {
                    for (int hh = 0; hh < group; ++hh) {
                        const float* qh =
                            in.q.data() + i * in.q_dim + (g * group + hh) * c.head_dim;
                        const int32_t visible = c.n_past + i + 1;
                        std::vector<double> w(visible);
                        double mx = -1e300, sum = 0;
                        for (int32_t j = 0; j < visible; ++j) {
                            const auto* k = reinterpret_cast<const uint16_t*>(
                                in.k.data() + in.slots[j] * in.view.row_stride +
                                g * c.head_dim * 2);
                            double dot = 0;
                            for (int d = 0; d < c.head_dim; ++d)
                                dot += double(qh[d]) * fp16_to_fp32(k[d]);
                            w[j] = dot * in.shape.scale;
                            mx = std::max(mx, w[j]);
                        }
                        for (auto& x : w) sum += (x = std::exp(x - mx));
                        for (int32_t j = 0; j < visible; ++j)
                            want[j] += std::pow(w[j] / sum, power);
                    }
                }
                for (int32_t j = 0; j < n; ++j)
                    ASSERT_NEAR(got[g][j], want[j], 1e-4) << "entry " << j;
            }
        }
    }
}

// A sliding window (Gemma 3's local layers): each query sees the `window` entries ending at
// its own. The truth, made without the window: each query alone over a view of just those
// entries. The kernel, the reference and llama.cpp's rounding give it, on every path
// (a chunk past the window, a chunk inside it, decode split over keys, per-head lists) and
// on views that hold more than the window (a cache that keeps every token) or just it.
TEST(AttentionWindow, EachQuerySeesTheWindowEndingAtItself) {
    struct WindowCase {
        Case c;
        int32_t window;
    };
    for (const WindowCase& wc :
         {WindowCase{{9, 3, 64, 600, 70, DType::kF16}, 512},  // tiled, past the window
          WindowCase{{9, 3, 64, 100, 37, DType::kF16}, 64},   // rows whose windows differ
          WindowCase{{9, 3, 64, 2000, 1, DType::kF16}, 512},  // decode over a long view
          WindowCase{{9, 3, 64, 511, 1, DType::kF16}, 512},   // the view is the window
          WindowCase{{4, 1, 128, 40, 5, DType::kF32}, 7},     // few rows, windows of 7
          WindowCase{{8, 4, 8, 3, 4, DType::kF32}, 100}}) {   // a window longer than the view
        const Case& c = wc.c;
        const Inputs in = make_inputs(c);
        KvView windowed = in.view;
        windowed.window = wc.window;
        std::vector<float> want(in.q.size()), got(in.q.size(), -1.0f), ref(in.q.size(), -2.0f);
        ThreadPool pool(2);
        for (int32_t i = 0; i < c.n_q; ++i) {
            const int32_t end = c.n_past + i + 1;
            const int32_t begin = std::max(0, end - wc.window);
            KvView alone = in.view;
            alone.slots = in.slots.data() + begin;
            alone.n = end - begin;
            attention(in.shape, alone, in.q.data() + i * in.q_dim, in.q_dim, 1,
                      want.data() + i * in.q_dim, in.q_dim, pool);
        }
        attention(in.shape, windowed, in.q.data(), in.q_dim, c.n_q, got.data(), in.q_dim, pool);
        attention_reference(in.shape, windowed, in.q.data(), in.q_dim, c.n_q, ref.data(), in.q_dim);
        EXPECT_LT(max_abs_diff(got, want), 2e-5) << c.n_past << " + " << c.n_q;
        EXPECT_LT(max_abs_diff(ref, want), 2e-5) << c.n_past << " + " << c.n_q;
        if (c.dtype == DType::kF16) {
            std::vector<float> ggml(in.q.size(), -3.0f);
            attention_ggml(in.shape, windowed, in.q.data(), in.q_dim, c.n_q, c.n_past, ggml.data(),
                           in.q_dim, 2, pool);
            EXPECT_LT(max_abs_diff(ggml, want), 2e-2) << c.n_past << " + " << c.n_q;
        }
        // Without the causal mask the window does not apply: every entry is seen.
        std::vector<float> open(in.q.size()), open_windowed(in.q.size());
        std::vector<float> lse(static_cast<size_t>(c.n_q) * c.n_heads), lse_w(lse.size());
        attention(in.shape, in.view, in.q.data(), in.q_dim, c.n_q, open.data(), in.q_dim, pool,
                  lse.data(), false);
        attention(in.shape, windowed, in.q.data(), in.q_dim, c.n_q, open_windowed.data(), in.q_dim,
                  pool, lse_w.data(), false);
        EXPECT_EQ(open, open_windowed);
    }
    // Per-head lists take the window too: one KV head's list, the others' windows alike.
    const Case c{4, 2, 64, 300, 3, DType::kF16};
    const Inputs in = make_inputs(c);
    const int32_t n = c.n_past + c.n_q;
    const int32_t* lists[2] = {in.slots.data(), in.slots.data()};
    const int32_t counts[2] = {n, n};
    KvView per_head = in.view;
    per_head.head_slots = lists;
    per_head.head_n = counts;
    per_head.window = 50;
    KvView shared = in.view;
    shared.window = 50;
    std::vector<float> a(in.q.size()), b(in.q.size());
    ThreadPool pool(2);
    attention(in.shape, per_head, in.q.data(), in.q_dim, c.n_q, a.data(), in.q_dim, pool);
    attention(in.shape, shared, in.q.data(), in.q_dim, c.n_q, b.data(), in.q_dim, pool);
    EXPECT_LT(max_abs_diff(a, b), 1e-6);
}

// llama.cpp-compatible attention: still attention (close to the exact result, within the
// fp16 rounding of its accumulator), on each of ggml's paths, and the same bits whatever the
// pool size (only n_split, llama.cpp's thread count, may change them).
class AttentionGgmlTest : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionGgmlTest, CloseToReferenceAndIndependentOfPoolSize) {
    const Case c = GetParam();
    const Inputs in = make_inputs(c);
    std::vector<float> want(in.q.size()), got1(in.q.size(), -1.0f), got3(in.q.size(), -2.0f);
    attention_reference(in.shape, in.view, in.q.data(), in.q_dim, c.n_q, want.data(), in.q_dim);
    ThreadPool one(1), three(3);
    attention_ggml(in.shape, in.view, in.q.data(), in.q_dim, c.n_q, c.n_past, got1.data(), in.q_dim,
                   2, one);
    attention_ggml(in.shape, in.view, in.q.data(), in.q_dim, c.n_q, c.n_past, got3.data(), in.q_dim,
                   2, three);
    // The unnormalised output is summed in fp16 (as llama.cpp does): over a few hundred keys
    // that costs up to ~1e-2 here, where values are of order 1.
    EXPECT_LT(max_abs_diff(got1, want), 2e-2);
    EXPECT_EQ(got1, got3);
}

INSTANTIATE_TEST_SUITE_P(
    Paths, AttentionGgmlTest,
    ::testing::Values(Case{9, 3, 64, 0, 37, DType::kF16},    // one row at a time, fp16 Q
                      Case{9, 3, 64, 100, 3, DType::kF16},   // a short batch after a prompt
                      Case{9, 3, 64, 30, 70, DType::kF16},   // 64+ queries: the tiled path
                      Case{9, 3, 64, 300, 1, DType::kF16},   // decode over 512 padded cells: split
                      Case{9, 3, 64, 2000, 1, DType::kF16},  // decode, split, long
                      Case{4, 4, 128, 33, 17, DType::kF16},  // two 64-element dot steps
                      Case{4, 2, 80, 20, 5, DType::kF16}));  // dot leftovers past 64

TEST(AttentionGgml, SplitCountChangesOnlyRounding) {
    const Case c{9, 3, 64, 600, 1, DType::kF16};
    const Inputs in = make_inputs(c);
    ThreadPool pool(2);
    std::vector<float> two(in.q.size()), four(in.q.size());
    attention_ggml(in.shape, in.view, in.q.data(), in.q_dim, 1, c.n_past, two.data(), in.q_dim, 2,
                   pool);
    attention_ggml(in.shape, in.view, in.q.data(), in.q_dim, 1, c.n_past, four.data(), in.q_dim, 4,
                   pool);
    EXPECT_NE(two, four);
    EXPECT_LT(max_abs_diff(two, four), 2e-2);
}

}  // namespace
}  // namespace deltaserve::kernels
