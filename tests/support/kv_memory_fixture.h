// The fixture of the decode worker's KV memory tests (tests/decode/kv_memory*_test.cpp): a
// DecodeWorker on the default model with a KV memory of so many blocks.
#pragma once

#include <memory>
#include <string>

#include "decode_turns.h"
#include "default_model.h"
#include "deltaserve/decode/decode_worker.h"
#include "test_paths.h"

namespace deltaserve::testing {

constexpr int32_t kBlock = 16;  // kvstore::BlockPool::kBlockTokens

class KvMemoryTest : public DefaultModelTest {
  protected:
    // Bytes of one block: every layer's K and V rows of 16 tokens, fp16.
    size_t block() const {
        return static_cast<size_t>(kBlock) * model_->config.n_layers * model_->config.kv_dim() * 2 *
               2;
    }
    void start(int32_t blocks, size_t prefix_cache_bytes = 0, int32_t local_prefill_max = 100000,
               const std::string& policy = "full") {
        decode::DecodeOptions d;
        d.context.kv.policy = policy;
        if (policy == "deltakv") {
            d.context.kv.keep = 0.3f;
            d.context.kv_profile = default_deltakv_profile();
        }
        d.context.n_ctx = 1024;
        d.context.n_threads = 2;
        d.context.n_batch = 256;
        d.threads = 2;
        d.kv_memory = block() * static_cast<size_t>(blocks);
        d.prefix_cache_bytes = prefix_cache_bytes;
        d.local_prefill_max = local_prefill_max;
        d.model_id = "m";
        d.host_tier = host_tier_;
        d.disk_tier = disk_tier_;
        d.device_tier = device_tier_;
        d.store_id = "test store";
        decode_.reset();
        auto dw = decode::DecodeWorker::create(*model_, d);
        ASSERT_TRUE(dw.ok()) << dw.error().to_string();
        decode_ = std::move(*dw);
    }
    void TearDown() override { decode_.reset(); }
    // Runs a local turn to its end.
    Result<decode::TurnEnd> run(const decode::TurnSpec& spec) {
        auto sink = std::make_shared<CollectingSink>();
        auto plan = decode_->start_turn(spec, sink);
        if (!plan.ok()) return plan.status();
        return sink->wait();
    }
    std::unique_ptr<decode::DecodeWorker> decode_;
    std::shared_ptr<kvstore::HostTier> host_tier_;  // set before start(): sessions demote there
    std::shared_ptr<kvstore::DiskTier> disk_tier_;  // set before start(): turns are stored there
    std::shared_ptr<kvstore::DeviceTier> device_tier_;  // set before start(): above the host tier
};

}  // namespace deltaserve::testing
