// The decode worker's KV memory (decode::DecodeOptions::kv_memory), on the default model with
// full KV: one pool of blocks per node; a turn books the most its KV can grow to, idle
// sessions are dropped for it least recently used first, and a turn that cannot be booked is
// refused with kResourceExhausted (HTTP 429) saying why; sessions sharing a prompt's prefix
// hold its blocks once; nothing stays held after turns end, are cancelled or fail.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include "kv_memory_fixture.h"
#include "own_memory_backend.h"

namespace deltaserve {
namespace {

using testing::CollectingSink;
using testing::KvMemoryTest;

TEST_F(KvMemoryTest, ATurnThatCanNeverFitIsRefusedAndOneThatFitsRuns) {
    start(20);  // 320 tokens
    // No max_tokens: the answer may fill the 1024-token context.
    auto open = decode_->start_turn(testing::greedy_turn(1, text_tokens(100, 0, true), "", -1),
                                    std::make_shared<CollectingSink>());
    ASSERT_FALSE(open.ok());
    EXPECT_EQ(open.status().code(), StatusCode::kResourceExhausted);
    EXPECT_NE(open.status().message().find("--kv-memory"), std::string::npos)
        << open.status().message();
    auto r = run(testing::greedy_turn(2, text_tokens(100, 0, true), "", 8));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->prompt_tokens, 100);
    const auto st = decode_->stats();
    EXPECT_EQ(st.kv_booked, 0);
    EXPECT_EQ(st.kv_pool_used, 0) << "a stateless turn keeps nothing";
    EXPECT_EQ(st.kv_memory, static_cast<int64_t>(20 * block()));
}

TEST_F(KvMemoryTest, IdleSessionsAreDroppedForANewTurnLeastRecentFirst) {
    start(20);
    // 100 + 8 tokens: 7 blocks held, 8 booked (one for a copy-on-write).
    for (const char* s : {"a", "b"}) {
        auto r = run(testing::greedy_turn(s[0], text_tokens(100, 0, true), s, 8));
        ASSERT_TRUE(r.ok()) << r.status().to_string();
    }
    EXPECT_EQ(decode_->stats().sessions, 2);
    EXPECT_EQ(decode_->stats().kv_pool_used, static_cast<int64_t>(14 * block()));
    // c books 8 beside 14 idle: a, the least recently used, goes.
    ASSERT_TRUE(run(testing::greedy_turn(3, text_tokens(100, 0, true), "c", 8)).ok());
    EXPECT_EQ(decode_->stats().sessions, 2);
    // b kept its KV: its next turn prefills only what is new; a's starts again.
    auto b = run(testing::greedy_turn(4, text_tokens(120, 0, true), "b", 4));
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    EXPECT_EQ(b->cached_tokens, 100);
    auto a = run(testing::greedy_turn(5, text_tokens(120, 0, true), "a", 4));
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    EXPECT_EQ(a->cached_tokens, 0);
}

// Sessions a, b and c on a worker with tiers: the turns the tier tests share.
class TieredTurns : public KvMemoryTest {
  protected:
    // a's second turn's answer when a's KV stays in decode memory.
    std::string answer_when_kept() {
        start(200);
        EXPECT_TRUE(run(testing::greedy_turn(1, text_tokens(100, 0, true), "a", 8)).ok());
        auto stayed = run(testing::greedy_turn(2, text_tokens(120, 0, true), "a", 8));
        EXPECT_TRUE(stayed.ok()) << stayed.status().to_string();
        if (stayed.ok()) EXPECT_EQ(stayed->cached_tokens, 100);
        return stayed.ok() ? stayed->text : "";
    }
    // A worker of 20 blocks (with the tiers set before) runs a's, b's and c's first turns:
    // c's drops a for room.
    void drop_a_for_c() {
        start(20);
        for (const char* s : {"a", "b", "c"}) {
            ASSERT_TRUE(run(testing::greedy_turn(s[0], text_tokens(100, 0, true), s, 8)).ok());
        }
        EXPECT_EQ(decode_->stats().tiers.sessions_demoted, 1);  // a, for c's room
    }
    // a's second turn: its KV came back (cached, not prefilled), and its answer.
    void a_comes_back(const std::string& kept, uint64_t id) {
        auto a = run(testing::greedy_turn(id, text_tokens(120, 0, true), "a", 8));
        ASSERT_TRUE(a.ok()) << a.status().to_string();
        EXPECT_EQ(a->cached_tokens, 100);
        EXPECT_EQ(a->text, kept);
        const auto st = decode_->stats();
        EXPECT_EQ(st.tiers.sessions_promoted(), 1);
        EXPECT_EQ(st.tiers.promoted_tokens, 107);  // the prompt and the answer but its last token
    }
    // Taking a back made room (b went to the tiers), and so do b's and c's next turns: c's
    // takes a's room. Then `damage` spoils a's stored blocks; a's next turn refuses them and
    // recomputes the history from there: the same answer.
    void a_damaged_is_recomputed(const std::string& kept, const std::function<void()>& damage) {
        ASSERT_TRUE(run(testing::greedy_turn(5, text_tokens(100, 0, true), "b", 8)).ok());
        ASSERT_TRUE(run(testing::greedy_turn(6, text_tokens(100, 0, true), "c", 8)).ok());
        ASSERT_EQ(decode_->stats().tiers.sessions_demoted, 4);
        EXPECT_EQ(decode_->stats().tiers.sessions_promoted(), 3);
        damage();
        auto again = run(testing::greedy_turn(7, text_tokens(120, 0, true), "a", 8));
        ASSERT_TRUE(again.ok()) << again.status().to_string();
        EXPECT_LT(again->cached_tokens, 100);
        EXPECT_EQ(again->text, kept);
        EXPECT_GE(decode_->stats().tiers.blocks_refused, 1);
    }
};

// With a host tier, the session dropped for room is demoted there, and its next turn takes
// its KV back and answers as if it had stayed.
TEST_F(TieredTurns, ADroppedSessionComesBackFromTheHostTier) {
    const std::string kept = answer_when_kept();
    kvstore::HostTier::Options ho;
    ho.capacity_bytes = 64 << 20;
    ho.janitor_interval = std::chrono::milliseconds(0);
    host_tier_ = std::make_shared<kvstore::HostTier>(ho);
    drop_a_for_c();
    EXPECT_EQ(host_tier_->stats().blocks, 2u);  // a's 107 tokens in blocks of 64 and 43
    a_comes_back(kept, 4);
    EXPECT_EQ(host_tier_->stats().leases, 0u) << "the turn's leases ended with the import";
    // (Full KV's blocks are shared prefixes: a, b and c begin alike, so their first block is
    // one block, which b's or c's demotion for a's room may store whole again before a's
    // blocks are read. The damaged tail is a's own.)
    a_damaged_is_recomputed(kept, [&] {
        for (uint64_t key : host_tier_->keys()) {
            auto lease = host_tier_->get(key, "test", kvstore::HostTier::Clock::now());
            ASSERT_TRUE(lease.ok());
            std::vector<uint8_t> bytes(lease->bytes().begin(), lease->bytes().end());
            lease->release();
            bytes[bytes.size() - 10] ^= 0x20;
            ASSERT_TRUE(
                host_tier_->put(key, std::make_shared<const std::vector<uint8_t>>(bytes)).ok());
        }
    });
}

// With a device tier above the host tier (here in a backend whose memory is its own, where a
// server's is a GPU's), a dropped session's blocks go there, and its next turn takes them
// from the device. A block damaged there is refused and dropped.
TEST_F(TieredTurns, ADroppedSessionComesBackFromTheDeviceTier) {
    const std::string kept = answer_when_kept();
    // Outlives every tier that allocated from it.
    static testing::OwnMemoryBackend& device = *new testing::OwnMemoryBackend();
    auto tier = kvstore::make_device_tier(device, 64 << 20);
    ASSERT_TRUE(tier.ok()) << tier.status().to_string();
    device_tier_ = std::move(*tier);
    kvstore::HostTier::Options ho;
    ho.capacity_bytes = 1;  // takes nothing: what comes back comes from the device
    ho.janitor_interval = std::chrono::milliseconds(0);
    host_tier_ = std::make_shared<kvstore::HostTier>(ho);
    drop_a_for_c();
    EXPECT_EQ(host_tier_->stats().blocks, 0u);
    EXPECT_EQ(device_tier_->stats().blocks, 2u);
    auto places = decode_->session_blocks("a");
    ASSERT_TRUE(places.ok()) << places.status().to_string();
    ASSERT_EQ(places->blocks.size(), 2u);
    for (const auto& p : places->blocks) {
        EXPECT_GT(p.device_bytes, 0);
        EXPECT_EQ(p.host_bytes, -1);
    }
    a_comes_back(kept, 4);
    const auto st = decode_->stats();
    EXPECT_EQ(st.tiers.promoted_device, 1);
    EXPECT_EQ(st.tiers.device_blocks, static_cast<int64_t>(device_tier_->stats().blocks));
    EXPECT_EQ(st.tiers.device_capacity, 64 << 20);
    a_damaged_is_recomputed(kept, [&] {
        auto stored = decode_->session_blocks("a");
        ASSERT_TRUE(stored.ok()) << stored.status().to_string();
        for (const auto& p : stored->blocks) {
            auto bytes = device_tier_->get(p.key);
            ASSERT_TRUE(bytes.ok()) << bytes.status().to_string();
            (*bytes)[bytes->size() - 10] ^= 0x20;
            ASSERT_TRUE(device_tier_->put(p.key, *bytes).ok());
        }
    });
}

TEST_F(KvMemoryTest, RunningTurnsBookTheMemoryAndTheNextIsRefusedUntilOneEnds) {
    start(20);
    auto long_turn = std::make_shared<CollectingSink>();
    // 100 + 200 tokens: 19 blocks booked, and one for a copy-on-write: all 20.
    ASSERT_TRUE(
        decode_->start_turn(testing::greedy_turn(1, text_tokens(100, 0, true), "", 200), long_turn)
            .ok());
    const auto next = testing::greedy_turn(2, text_tokens(60, 300, true), "", 8);
    auto refused = decode_->start_turn(next, std::make_shared<CollectingSink>());
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
    EXPECT_NE(refused.status().message().find("KV memory is full"), std::string::npos)
        << refused.status().message();
    EXPECT_EQ(decode_->stats().kv_booked, static_cast<int64_t>(20 * block()));
    ASSERT_TRUE(long_turn->wait().ok());
    auto r = run(next);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(decode_->stats().kv_booked, 0);
}

// The KV a prompt holds while this node prefills it counts in the stats (and the metrics
// made from them) before its first token: a long prompt is not invisible for its prefill.
TEST_F(KvMemoryTest, APromptBeingPrefilledCountsInTheKvBytes) {
    start(64);
    auto sink = std::make_shared<CollectingSink>();
    ASSERT_TRUE(
        decode_->start_turn(testing::greedy_turn(1, text_tokens(900, 0, true), "", 4), sink).ok());
    bool seen = false;
    for (int i = 0; i < 20000 && !seen; ++i) {
        const auto st = decode_->stats();
        if (st.running == 0 && st.waiting == 1 && st.kv_bytes > 0) seen = true;
        if (st.running == 1) break;  // past its prefill
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_TRUE(seen) << "no KV bytes counted while the prompt was prefilled";
    ASSERT_TRUE(sink->wait().ok());
}

// A turn refused because the running turns booked the memory drops no idle session first:
// dropping them all would not have made room, and their next turns would prefill again.
TEST_F(KvMemoryTest, ATurnRefusedForMemoryDropsNoIdleSession) {
    start(30);
    ASSERT_TRUE(run(testing::greedy_turn(1, text_tokens(60, 0, true), "idle", 4)).ok());
    const int64_t idle_bytes = decode_->stats().kv_pool_used;
    EXPECT_GT(idle_bytes, 0);
    // 100 + 200 tokens: 20 blocks booked beside the idle session's 4.
    auto long_turn = std::make_shared<CollectingSink>();
    ASSERT_TRUE(
        decode_
            ->start_turn(testing::greedy_turn(2, text_tokens(100, 500, true), "", 200), long_turn)
            .ok());
    // 180 + 8 tokens: 12 blocks or more, more than the 10 the running turn left.
    auto refused = decode_->start_turn(testing::greedy_turn(3, text_tokens(180, 300, true), "", 8),
                                       std::make_shared<CollectingSink>());
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
    EXPECT_EQ(decode_->stats().sessions, 1) << "the idle session was dropped for nothing";
    ASSERT_TRUE(long_turn->wait().ok());
    auto again = run(testing::greedy_turn(4, text_tokens(70, 0, true), "idle", 4));
    ASSERT_TRUE(again.ok()) << again.status().to_string();
    EXPECT_EQ(again->cached_tokens, 60) << "the idle session kept its KV";
}

TEST_F(KvMemoryTest, SessionsSharingASystemPromptHoldItsBlocksOnce) {
    start(256, size_t{64} << 20);
    const auto system = text_tokens(256, 0, true);
    auto prompt = [&](size_t skip) {
        auto p = system;
        const auto q = text_tokens(20, skip);
        p.insert(p.end(), q.begin(), q.end());
        return p;
    };
    ASSERT_TRUE(run(testing::greedy_turn(1, prompt(400), "s1", 8)).ok());
    auto second = run(testing::greedy_turn(2, prompt(500), "s2", 8));
    ASSERT_TRUE(second.ok()) << second.status().to_string();
    EXPECT_EQ(second->cached_tokens, 256);
    const auto st = decode_->stats();
    // The sessions' bytes count the 16 shared blocks twice; the pool holds them once (and the
    // prefix cache's blocks are the sessions' own).
    EXPECT_EQ(st.kv_pool_used, st.kv_bytes - static_cast<int64_t>(16 * block()));
    EXPECT_EQ(st.prefix_cache_bytes, st.kv_pool_used - static_cast<int64_t>(2 * block()))
        << "every whole block of both sessions is cached; each has one partial block";
}

TEST_F(KvMemoryTest, NothingStaysHeldAfterTurnsEndAreCancelledOrFail) {
    start(64, 0, 0);  // every prompt goes to a prefill node (none here)
    // A turn waiting for its KV fails (its prefill failed): its booking goes.
    auto waiting = std::make_shared<CollectingSink>();
    auto plan =
        decode_->start_turn(testing::greedy_turn(1, text_tokens(100, 0, true), "w", 8), waiting);
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    EXPECT_TRUE(plan->remote_prefill);
    EXPECT_GT(decode_->stats().kv_booked, 0);
    decode_->cancel(1, unavailable("the prefill failed"));
    EXPECT_EQ(waiting->wait().status().code(), StatusCode::kUnavailable);
    EXPECT_EQ(decode_->stats().kv_booked, 0);
    // A running turn cancelled by its client, and one that ends: no block left but the
    // session's.
    start(64);
    auto quitter = std::make_shared<CollectingSink>(3);
    ASSERT_TRUE(
        decode_->start_turn(testing::greedy_turn(2, text_tokens(100, 0, true), "", 100), quitter)
            .ok());
    auto end = quitter->wait();
    ASSERT_TRUE(end.ok()) << end.status().to_string();
    EXPECT_EQ(end->finish_reason, "cancelled");
    ASSERT_TRUE(run(testing::greedy_turn(3, text_tokens(40, 0, true), "kept", 4)).ok());
    auto st = decode_->stats();
    EXPECT_EQ(st.kv_booked, 0);
    EXPECT_EQ(st.kv_pool_used, st.kv_bytes) << "only the session's blocks";
    decode_->drop_session("kept");
    EXPECT_EQ(decode_->stats().kv_pool_used, 0);
}

}  // namespace
}  // namespace deltaserve
