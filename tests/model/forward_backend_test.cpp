// The forward pass on a backend whose memory is not the host's, as a GPU's is not
// (own_memory_backend.h): its results must be the CPU backend's bits, full KV's block pool
// included, which lives in that memory.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "default_model.h"
#include "deltaserve/kernels/backend.h"
#include "deltaserve/model/deltakv_profile.h"
#include "deltaserve/model/inference_context.h"
#include "deltaserve/model/sampler.h"
#include "own_memory_backend.h"
#include "test_paths.h"

namespace deltaserve::model {
namespace {

namespace k = deltaserve::kernels;

using testing::OwnMemoryBackend;

class ForwardBackendTest : public testing::DefaultModelTest {
  protected:
    ContextOptions options(const std::string& policy, k::Backend* backend) const {
        ContextOptions co;
        co.n_ctx = 1024;
        co.n_batch = 96;  // the prompt in several chunks
        co.threads = threads_;
        co.kv.policy = policy;
        co.kv.keep = policy == "full" ? 1.0f : 0.3f;
        if (policy == "deltakv") co.kv_profile = testing::default_deltakv_profile();
        co.backend = backend;
        return co;
    }
    // Three full-KV contexts on the CPU and three on own_, pair i prefilled with the same
    // prompt of first + 11 i tokens; `name_cpu`: the second CPU one names the CPU backend
    // (nullptr and the CPU backend named are the same backend to a runner).
    struct Pairs {
        std::vector<std::unique_ptr<InferenceContext>> cpu, own;
        std::vector<InferenceContext*> cs, os;
    };
    void prefill_pairs(Pairs& p, int32_t first, bool name_cpu = false) {
        for (int i = 0; i < 3; ++i) {
            auto c = InferenceContext::create(
                *model_, options("full", name_cpu && i == 1 ? k::find_backend("cpu") : nullptr));
            auto o = InferenceContext::create(*model_, options("full", &own_));
            ASSERT_TRUE(c.ok() && o.ok());
            const std::vector<int32_t> prompt = text_tokens(first + 11 * i, 40 * i, true);
            ASSERT_TRUE((*c)->eval(prompt).ok());
            ASSERT_TRUE((*o)->eval(prompt).ok());
            p.cs.push_back(c->get());
            p.os.push_back(o->get());
            p.cpu.push_back(std::move(*c));
            p.own.push_back(std::move(*o));
        }
    }
    static int32_t greedy(std::span<const float> l) {
        return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    }
    std::shared_ptr<ThreadPool> threads_ = std::make_shared<ThreadPool>(2);
    // As a registered backend, it outlives the model that keeps its weights.
    static inline OwnMemoryBackend& own_ = *new OwnMemoryBackend();
};

TEST_F(ForwardBackendTest, TheCpuBackendsBitsFromMemoryOfItsOwn) {
    // Long enough for DeltaKV to compress (twice its window past the sinks).
    const std::vector<int32_t> prompt = text_tokens(200, 0, true);
    for (const std::string policy : {"full", "deltakv", "snapkv"}) {
        auto cpu = InferenceContext::create(*model_, options(policy, nullptr));
        auto own = InferenceContext::create(*model_, options(policy, &own_));
        ASSERT_TRUE(cpu.ok() && own.ok()) << policy;
        const int encodes = own_.encodes(), latent_attentions = own_.latent_attentions();
        auto a = (*cpu)->eval(prompt);
        auto b = (*own)->eval(prompt);
        ASSERT_TRUE(a.ok()) << a.error().to_string();
        ASSERT_TRUE(b.ok()) << policy << ": " << b.error().to_string();
        for (int step = 0; step < 6; ++step) {
            ASSERT_EQ(a->size(), b->size());
            ASSERT_EQ(std::memcmp(a->data(), b->data(), a->size() * sizeof(float)), 0)
                << policy << ", step " << step;
            const int32_t next = greedy(*a);
            a = (*cpu)->eval(std::span<const int32_t>(&next, 1));
            b = (*own)->eval(std::span<const int32_t>(&next, 1));
            ASSERT_TRUE(a.ok() && b.ok()) << policy << ", step " << step;
        }
        EXPECT_EQ((*cpu)->n_past(), (*own)->n_past());
        EXPECT_EQ((*cpu)->kv_bytes(), (*own)->kv_bytes()) << policy;
        if (policy == "full") {  // full KV lives in the backend's memory and is attended there
            ASSERT_NE((*own)->kv_block_pool(), nullptr);
            EXPECT_EQ((*own)->kv_block_pool()->device(), &own_);
            EXPECT_EQ((*cpu)->kv_block_pool()->device(), nullptr);
        }
        if (policy == "deltakv") {  // so does DeltaKV: it compressed and attended latents there
            EXPECT_GT(own_.encodes(), encodes);
            EXPECT_GT(own_.latent_attentions(), latent_attentions);
        }
    }
}

TEST_F(ForwardBackendTest, FullKvIsStoredAndAttendedInTheBackendsMemory) {
    auto own = InferenceContext::create(*model_, options("full", &own_));
    ASSERT_TRUE(own.ok());
    const int before = own_.attentions();
    ASSERT_TRUE((*own)->eval(text_tokens(100, 0, true)).ok());
    // One attention per layer and chunk of 96 (two chunks), over the pool's own memory.
    EXPECT_EQ(own_.attentions() - before, 2 * model_->config.n_layers);
}

// Full KV and DeltaKV (its rows, latents and pins) leave the backend's memory as the CPU's
// bytes and come back into another context there, which goes on with the CPU's logits.
TEST_F(ForwardBackendTest, KvLeavesTheBackendsMemoryAndComesBackExactly) {
    for (const std::string policy : {"full", "deltakv"}) {
        SCOPED_TRACE(policy);
        auto cpu = InferenceContext::create(*model_, options(policy, nullptr));
        auto own = InferenceContext::create(*model_, options(policy, &own_));
        ASSERT_TRUE(cpu.ok() && own.ok());
        const std::vector<int32_t> prompt = text_tokens(200, 0, true);
        ASSERT_TRUE((*cpu)->eval(prompt).ok());
        ASSERT_TRUE((*own)->eval(prompt).ok());
        auto state = (*own)->export_kv_state();
        ASSERT_TRUE(state.ok());
        EXPECT_EQ(*state, *(*cpu)->export_kv_state());
        EXPECT_EQ((*own)->export_kv_hints(), (*cpu)->export_kv_hints());
        std::vector<std::vector<uint8_t>> layers;
        for (int32_t l = 0; l < model_->config.n_layers; ++l) {
            auto part = (*own)->export_kv_layer(l);
            ASSERT_TRUE(part.ok()) << part.status().to_string();
            EXPECT_EQ(*part, *(*cpu)->export_kv_layer(l)) << "layer " << l;
            auto rows = (*own)->export_kv_rows(l, 10, 190);
            ASSERT_TRUE(rows.ok()) << rows.status().to_string();
            EXPECT_EQ(*rows, *(*cpu)->export_kv_rows(l, 10, 190)) << "layer " << l;
            layers.push_back(std::move(*part));
        }

        // Into another context on the backend; a part of the wrong size changes nothing.
        auto back = InferenceContext::create(*model_, options(policy, &own_));
        ASSERT_TRUE(back.ok());
        ASSERT_TRUE((*back)->import_kv_state(*state).ok());
        std::vector<uint8_t> short_part(layers[0].begin(), layers[0].end() - 1);
        EXPECT_EQ((*back)->import_kv_layer(0, short_part).code(), StatusCode::kDataLoss);
        for (int32_t l = 0; l < model_->config.n_layers; ++l)
            ASSERT_TRUE((*back)->import_kv_layer(l, layers[static_cast<size_t>(l)]).ok());
        ASSERT_TRUE((*back)->import_kv_hints((*cpu)->export_kv_hints()).ok());
        int32_t next = 17;
        for (int step = 0; step < 6; ++step) {
            auto a = (*cpu)->eval(std::span<const int32_t>(&next, 1));
            auto b = (*back)->eval(std::span<const int32_t>(&next, 1));
            ASSERT_TRUE(a.ok() && b.ok());
            ASSERT_EQ(std::memcmp(a->data(), b->data(), a->size() * sizeof(float)), 0) << step;
            next = greedy(*a);
        }
    }
}

TEST_F(ForwardBackendTest, ASharedPrefixTruncatedIntoIsCopiedInTheBackendsMemory) {
    // B takes A's first two blocks (32 tokens), keeps 20 and goes on: its next reserve copies
    // the block A still holds. On both backends the same bits, and A's own tokens untouched.
    const std::vector<int32_t> a_tokens = text_tokens(40, 0, true), b_more = text_tokens(15, 300);
    std::vector<std::vector<float>> logits[2];
    int slot = 0;
    for (k::Backend* backend :
         {static_cast<k::Backend*>(nullptr), static_cast<k::Backend*>(&own_)}) {
        ContextOptions co = options("full", backend);
        co.n_ctx = 256;
        const ModelConfig& c = model_->config;
        kvstore::BlockPoolOptions po{c.n_layers, c.kv_dim(), c.n_kv_heads, k::DType::kF16, 32};
        po.backend = backend;
        auto pool = kvstore::BlockPool::create(po);
        ASSERT_TRUE(pool.ok());
        EXPECT_EQ((*pool)->device(), backend);
        co.kv_blocks = *pool;  // one pool for both
        auto first = InferenceContext::create(*model_, co);
        auto second = InferenceContext::create(*model_, co);
        ASSERT_TRUE(first.ok());
        ASSERT_TRUE(second.ok()) << second.status().to_string();
        ASSERT_TRUE((*first)->eval(a_tokens).ok());
        ASSERT_TRUE((*second)->adopt_kv_blocks((*first)->kv_blocks(2)).ok());
        (*second)->truncate(20);
        auto b = (*second)->eval(b_more);
        ASSERT_TRUE(b.ok()) << b.status().to_string();
        const int32_t one = 5;
        auto a = (*first)->eval(std::span<const int32_t>(&one, 1));
        ASSERT_TRUE(a.ok());
        logits[slot].emplace_back(b->begin(), b->end());
        logits[slot].emplace_back(a->begin(), a->end());
        ++slot;
    }
    for (size_t i = 0; i < 2; ++i) {
        ASSERT_EQ(logits[0][i].size(), logits[1][i].size());
        EXPECT_EQ(std::memcmp(logits[0][i].data(), logits[1][i].data(),
                              logits[0][i].size() * sizeof(float)),
                  0)
            << (i == 0 ? "the sequence that copied the block" : "the one that kept it");
    }
}

TEST_F(ForwardBackendTest, ABatchOnTheBackendAndWeightsUploadedOnce) {
    // The weights live with the model: a test before this one in the process may have made
    // them already.
    const bool made_before = model_->on_backends.find(&own_) != nullptr;
    const int uploads_before = own_.uploads();
    Pairs pairs;
    ASSERT_NO_FATAL_FAILURE(prefill_pairs(pairs, 40, /*name_cpu=*/true));
    const auto& cs = pairs.cs;
    const auto& os = pairs.os;
    // Every matrix once for this model and backend, however many contexts (tied output: the
    // embedding's).
    const int matrices = 1 + (model_->weights.output.data != model_->weights.token_embd.data) +
                         7 * model_->config.n_layers;
    EXPECT_EQ(own_.uploads() - uploads_before, made_before ? 0 : matrices);
    EXPECT_NE(model_->on_backends.find(&own_), nullptr);

    BatchRunner cpu_runner(*model_, threads_, AttentionNumerics::kNative);
    BatchRunner own_runner(*model_, threads_, AttentionNumerics::kNative, &own_);
    const int32_t next[] = {42, 1000, 7};
    const std::span<const int32_t> tokens[] = {{&next[0], 1}, {&next[1], 1}, {&next[2], 1}};
    std::vector<float> a, b;
    ASSERT_TRUE(cpu_runner.run(cs, tokens, a).ok());
    const int attentions = own_.attentions(), batches = own_.attention_batches();
    const Status st = own_runner.run(os, tokens, b);
    ASSERT_TRUE(st.ok()) << st.to_string();
    // The three sequences' views in one batch per layer.
    EXPECT_EQ(own_.attention_batches() - batches, model_->config.n_layers);
    EXPECT_EQ(own_.attentions() - attentions, 3 * model_->config.n_layers);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
    // Contexts on another backend than the runner's are refused.
    EXPECT_EQ(cpu_runner.run(os, tokens, b).code(), StatusCode::kInvalidArgument);
    std::vector<InferenceContext*> mixed = {cs[0], os[1]};
    const std::span<const int32_t> two[] = {tokens[0], tokens[1]};
    EXPECT_EQ(eval_batch(mixed, two, b).code(), StatusCode::kInvalidArgument);
}

// A batch's rows as candidates on the backend (BatchRunner::run with wants): each sampler's
// picks from them are its picks from the whole row on the CPU, and the rows that did not ask
// come over whole.
TEST_F(ForwardBackendTest, CandidatesFromTheBackendSampleAsWholeRows) {
    Pairs pairs;
    ASSERT_NO_FATAL_FAILURE(prefill_pairs(pairs, 30));
    const auto& cs = pairs.cs;
    const auto& os = pairs.os;
    std::vector<Sampler> whole, from_top;
    for (int i = 0; i < 3; ++i) {
        SamplingParams p;
        p.temperature = i == 0 ? 0.0f : 1.0f;
        p.repeat_penalty = i == 1 ? 1.4f : 1.0f;
        p.top_k = i == 2 ? 0 : 20;  // 2: the whole row
        p.seed = 7 + static_cast<uint64_t>(i);
        whole.emplace_back(p);
        from_top.emplace_back(p);
    }
    BatchRunner cpu_runner(*model_, threads_, AttentionNumerics::kNative);
    BatchRunner own_runner(*model_, threads_, AttentionNumerics::kNative, &own_);
    std::vector<int32_t> next = {42, 1000, 7};
    const size_t nv = static_cast<size_t>(model_->config.n_vocab);
    for (int step = 0; step < 10; ++step) {
        const std::span<const int32_t> tokens[] = {{&next[0], 1}, {&next[1], 1}, {&next[2], 1}};
        std::vector<float> a, b;
        ASSERT_TRUE(cpu_runner.run(cs, tokens, a).ok());
        std::vector<std::vector<int32_t>> penalized;
        std::vector<CandidateWant> wants;
        for (auto& s : from_top) penalized.push_back(s.penalized());
        for (size_t i = 0; i < 3; ++i)
            wants.push_back({from_top[i].candidates_wanted(), penalized[i]});
        std::vector<RowCandidates> candidates;
        const Status st = own_runner.run(os, tokens, wants, b, candidates);
        ASSERT_TRUE(st.ok()) << st.to_string();
        ASSERT_EQ(candidates.size(), 3u);
        for (size_t i = 0; i < 3; ++i) {
            const std::span<const float> row(a.data() + i * nv, nv);
            const int32_t expected = whole[i].sample(row);
            int32_t got = 0;
            if (wants[i].top == 0) {
                EXPECT_TRUE(candidates[i].ids.empty());
                got = from_top[i].sample(std::span<const float>(b.data() + i * nv, nv));
            } else {
                ASSERT_FALSE(candidates[i].ids.empty());
                got = from_top[i].sample_candidates(candidates[i].ids, candidates[i].logits);
            }
            ASSERT_EQ(got, expected) << "sequence " << i << ", step " << step;
            whole[i].accept(expected);
            from_top[i].accept(got);
            next[i] = expected;
        }
    }
}

// A device failure anywhere in a turn fails it and keeps nothing of it, for DeltaKV also
// while it compresses; the next try gives the CPU's bits. (DeltaKV's compaction after a
// compression is the exception: a failed move leaves the rows where they were, and the turn
// stands, with the CPU's bits.)
TEST_F(ForwardBackendTest, ABackendErrorKeepsNothingAndTheNextTurnIsRight) {
    for (const std::string policy : {"full", "deltakv"}) {
        SCOPED_TRACE(policy);
        auto cpu = InferenceContext::create(*model_, options(policy, nullptr));
        ASSERT_TRUE(cpu.ok());
        // 150 tokens: DeltaKV compresses in the second turn (twice its window past the sinks).
        const std::vector<int32_t> first = text_tokens(60, 0, true), second = text_tokens(90, 60);
        ASSERT_TRUE((*cpu)->eval(first).ok());
        auto want = (*cpu)->eval(second);
        ASSERT_TRUE(want.ok());
        const std::vector<float> logits(want->begin(), want->end());
        const int32_t next = greedy(logits);
        auto step = (*cpu)->eval(std::span<const int32_t>(&next, 1));
        ASSERT_TRUE(step.ok());
        const std::vector<float> step_logits(step->begin(), step->end());
        // A session on the backend after the first turn; the second turn's pointer checks.
        const auto session = [&] {
            auto own = InferenceContext::create(*model_, options(policy, &own_));
            EXPECT_TRUE(own.ok() && (*own)->eval(first).ok());
            return std::move(*own);
        };
        int turn = 0;
        {
            auto probe = session();
            const int before = own_.checks();
            ASSERT_TRUE(probe->eval(second).ok());
            turn = own_.checks() - before;
        }
        ASSERT_GT(turn, 100);
        // Full KV: at its first op and mid-turn; DeltaKV deep in the turn (its compression
        // and attention through latents) and at its last check (the compaction).
        const std::vector<int> points = policy == "full"
                                            ? std::vector<int>{0, turn / 2}
                                            : std::vector<int>{turn / 3, 2 * turn / 3, turn - 1};
        int failed = 0, stood = 0;
        for (const int after : points) {
            auto own = session();
            own_.fail_after(after);
            auto got = own->eval(second);
            own_.fail_after(-1);
            if (got.ok()) {
                ++stood;
            } else {
                ++failed;
                EXPECT_NE(got.error().message().find("injected failure"), std::string::npos)
                    << got.error().to_string();
                EXPECT_EQ(own->n_past(), 60) << after << " of " << turn;
                got = own->eval(second);
                ASSERT_TRUE(got.ok());
            }
            EXPECT_EQ(std::memcmp(got->data(), logits.data(), logits.size() * sizeof(float)), 0)
                << after << " of " << turn;
            // And the session goes on as the CPU's.
            auto b = own->eval(std::span<const int32_t>(&next, 1));
            ASSERT_TRUE(b.ok());
            EXPECT_EQ(
                std::memcmp(b->data(), step_logits.data(), step_logits.size() * sizeof(float)), 0)
                << after << " of " << turn;
        }
        EXPECT_GE(failed, 2);
        if (policy == "full") EXPECT_EQ(stood, 0);
    }
}

TEST_F(ForwardBackendTest, DeltaKvsCompressorsGoUpOnceAndFp16LatentsStayOnTheCpu) {
    auto loaded = load_deltakv_profile(testing::default_deltakv_profile(), model_->config);
    ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
    std::shared_ptr<const kvstore::DeltaKvProfile> profile = std::move(*loaded);
    ContextOptions co = options("deltakv", &own_);
    co.deltakv_profile = profile;
    const int before = own_.uploads();
    auto first = InferenceContext::create(*model_, co);
    ASSERT_TRUE(first.ok()) << first.status().to_string();
    const int uploads = own_.uploads() - before;
    EXPECT_GT(uploads, 0);
    auto second = InferenceContext::create(*model_, co);
    ASSERT_TRUE(second.ok());
    EXPECT_EQ(own_.uploads() - before, uploads);

    auto fp16 = std::make_shared<kvstore::DeltaKvProfile>(*profile);
    fp16->latent_bits = 16;
    fp16->uploads = std::make_shared<kvstore::DeltaKvUploads>();
    co.deltakv_profile = fp16;
    auto refused = InferenceContext::create(*model_, co);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.error().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(refused.error().message().find("fp16 latents"), std::string::npos)
        << refused.error().to_string();
    co.backend = nullptr;
    EXPECT_TRUE(InferenceContext::create(*model_, co).ok());
}

TEST_F(ForwardBackendTest, APoolInAnotherBackendsMemoryIsRefused) {
    const ModelConfig& c = model_->config;
    kvstore::BlockPoolOptions po{c.n_layers, c.kv_dim(), c.n_kv_heads, k::DType::kF16, 8};
    po.backend = &own_;
    auto pool = kvstore::BlockPool::create(po);
    ASSERT_TRUE(pool.ok());
    ContextOptions co = options("full", nullptr);
    co.kv_blocks = *pool;
    auto ctx = InferenceContext::create(*model_, co);
    ASSERT_FALSE(ctx.ok());
    EXPECT_EQ(ctx.error().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(ctx.error().message().find("own-memory"), std::string::npos) << ctx.error().message();
}

TEST_F(ForwardBackendTest, LlamaCppsRoundingNeedsTheCpu) {
    ContextOptions co = options("full", &own_);
    co.attention = AttentionNumerics::kGgml;
    auto ctx = InferenceContext::create(*model_, co);
    ASSERT_FALSE(ctx.ok());
    EXPECT_EQ(ctx.error().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(ctx.error().message().find("CPU only"), std::string::npos);
}

TEST(ChooseBackend, NamesAndTheDefault) {
    auto cpu = k::choose_backend("cpu");
    ASSERT_TRUE(cpu.ok());
    EXPECT_EQ((*cpu)->name(), "cpu");
    EXPECT_EQ(k::choose_backend("gpu").status().code(), StatusCode::kInvalidArgument);
    k::Backend* cuda = k::find_backend("cuda");
    auto chosen = k::choose_backend("");
    ASSERT_TRUE(chosen.ok());
    auto asked = k::choose_backend("cuda");
    if (cuda != nullptr && cuda->available()) {
        EXPECT_EQ(*chosen, cuda);
        EXPECT_TRUE(asked.ok());
    } else {
        EXPECT_EQ((*chosen)->name(), "cpu");
        ASSERT_FALSE(asked.ok());
        EXPECT_EQ(asked.error().code(), StatusCode::kUnavailable);
        EXPECT_NE(asked.error().message().find("--device cuda"), std::string::npos)
            << asked.error().to_string();
    }
}

}  // namespace
}  // namespace deltaserve::model
