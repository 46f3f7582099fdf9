// The decode worker on a backend whose memory is not the host's (own_memory_backend.h, where a
// server's is a GPU's): full KV's pool in that memory, and the generating turns' samplers fed
// from the backend's top_k (the rest of each logits row stays there). Greedy and sampled
// turns, with a repetition penalty or top-k off, in sessions of two turns, answer as on the
// CPU backend.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "decode_turns.h"
#include "default_model.h"
#include "deltaserve/decode/decode_worker.h"
#include "own_memory_backend.h"

namespace deltaserve {
namespace {

using testing::CollectingSink;

class DecodeOnADevice : public testing::DefaultModelTest {
  protected:
    std::unique_ptr<decode::DecodeWorker> worker(kernels::Backend* backend) {
        decode::DecodeOptions d;
        d.context.n_ctx = 512;
        d.context.n_batch = 128;
        d.context.backend = backend;
        d.threads = 2;
        d.kv_memory = size_t{64} << 20;
        d.prefix_cache_bytes = 0;
        d.model_id = "m";
        auto w = decode::DecodeWorker::create(*model_, d);
        EXPECT_TRUE(w.ok()) << w.status().to_string();
        return w.ok() ? std::move(*w) : nullptr;
    }
    // Four sessions' two turns each, their texts in order. One turn at a time: how turns
    // that come together are chunked and batched depends on timing, and may change the last
    // bits of the logits and so a sampled token (BatchRunner's candidates over several rows
    // are checked in tests/model/forward_backend_test.cpp).
    std::vector<std::string> answers(decode::DecodeWorker& w) {
        std::vector<std::string> out;
        for (int turn = 0; turn < 2; ++turn) {
            for (int s = 0; s < 4; ++s) {
                decode::TurnSpec spec = testing::greedy_turn(
                    static_cast<uint64_t>(10 * turn + s + 1),
                    text_tokens(60 + 20 * turn, 7 * s, true), "s" + std::to_string(s), 16);
                if (s > 0) {  // 0 greedy; the others sampled, with a penalty or without top_k
                    spec.sampling.temperature = 0.9f;
                    spec.sampling.seed = 100 + static_cast<uint64_t>(s);
                    spec.sampling.top_k = s == 3 ? 0 : 40;
                    spec.sampling.repeat_penalty = s == 2 ? 1.3f : 1.0f;
                }
                auto sink = std::make_shared<CollectingSink>();
                auto plan = w.start_turn(spec, sink);
                EXPECT_TRUE(plan.ok()) << plan.status().to_string();
                auto end = sink->wait();
                EXPECT_TRUE(end.ok()) << end.status().to_string();
                out.push_back(end.ok() ? end->text : "");
            }
        }
        return out;
    }
    static inline testing::OwnMemoryBackend& own_ = *new testing::OwnMemoryBackend();
};

TEST_F(DecodeOnADevice, SampledTurnsAnswerAsOnTheCpu) {
    auto cpu = worker(nullptr);
    auto own = worker(&own_);
    ASSERT_TRUE(cpu && own);
    const std::vector<std::string> want = answers(*cpu);
    const int top_ks = own_.top_ks();
    EXPECT_EQ(answers(*own), want);
    EXPECT_GT(own_.top_ks() - top_ks, 0) << "the samplers were fed from the backend's top_k";
}

}  // namespace
}  // namespace deltaserve
