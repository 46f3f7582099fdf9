// The decode worker's write-through to the disk tier (decode::DecodeOptions::disk_tier), in
// one process on the default model, full KV and DeltaKV: a session turn's KV and record are on
// disk before its end is reported; another worker opened on the same store (a restart) takes
// the session back from disk and answers as a worker that never stopped; a store written for
// another model refuses nothing it should use and uses nothing it should refuse; no lease
// outlives the turn that took one.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "deltaserve/decode/session_record.h"
#include "deltaserve/kvstore/disk_tier.h"
#include "kv_memory_fixture.h"

namespace deltaserve {
namespace {

namespace fs = std::filesystem;
using testing::KvMemoryTest;

class SessionStoreTest : public KvMemoryTest, public ::testing::WithParamInterface<const char*> {
  protected:
    void SetUp() override {
        KvMemoryTest::SetUp();
        dir_ = (fs::temp_directory_path() /
                ("ds_session_store_" + std::to_string(::getpid()) + "_" + GetParam()))
                   .string();
        fs::remove_all(dir_);
    }
    void TearDown() override {
        KvMemoryTest::TearDown();
        disk_tier_.reset();
        fs::remove_all(dir_);
    }
    void open_store() {
        disk_tier_.reset();  // one handle at a time: RocksDB locks its directory
        kvstore::DiskTier::Options o;
        o.dir = dir_;
        o.capacity_bytes = uint64_t{1} << 30;
        auto d = kvstore::DiskTier::open(o);
        ASSERT_TRUE(d.ok()) << d.status().to_string();
        disk_tier_ = std::move(*d);
    }
    void restart(bool with_store) {
        decode_.reset();
        if (with_store) {
            open_store();
        } else {
            disk_tier_.reset();
        }
        kvstore::HostTier::Options ho;
        ho.capacity_bytes = 256 << 20;
        ho.janitor_interval = std::chrono::milliseconds(0);
        host_tier_ = std::make_shared<kvstore::HostTier>(ho);
        start(60, 0, 100000, GetParam());
    }
    std::string dir_;
};

TEST_P(SessionStoreTest, ATurnIsStoredBeforeItsEndAndARestartedWorkerResumesIt) {
    // The reference: two turns on a worker that keeps the session in memory.
    restart(false);
    auto first = run(testing::greedy_turn(1, text_tokens(100, 0, true), "s", 8));
    ASSERT_TRUE(first.ok()) << first.status().to_string();
    auto second = run(testing::greedy_turn(2, text_tokens(140, 0, true), "s", 8));
    ASSERT_TRUE(second.ok()) << second.status().to_string();
    EXPECT_EQ(second->kv_source, "decode");

    // The first turn with the store: when its end is reported, its KV is on disk.
    restart(true);
    auto stored = run(testing::greedy_turn(3, text_tokens(100, 0, true), "s", 8));
    ASSERT_TRUE(stored.ok()) << stored.status().to_string();
    EXPECT_EQ(stored->text, first->text);
    EXPECT_GT(disk_tier_->stats().blocks, 0u);
    auto records = disk_tier_->records("ds/");
    ASSERT_TRUE(records.ok());
    EXPECT_EQ(records->size(), 1u);
    EXPECT_EQ(decode_->stats().tiers.sessions_persisted, 1);
    // Where the session's KV is, as an operator asks (session_kv): in decode memory, and the
    // same tokens stored, their blocks in both tiers; an unknown id is all unknown.
    const auto kv = decode_->session_kv({"s", "nobody"});
    ASSERT_EQ(kv.size(), 2u);
    EXPECT_EQ(kv[0].tokens, 107);  // the prompt and the answer but its last token
    EXPECT_GT(kv[0].decode_bytes, 0);
    EXPECT_EQ(kv[0].stored_tokens, kv[0].tokens);
    EXPECT_EQ(kv[0].host_bytes, kv[0].disk_bytes);
    EXPECT_GT(kv[0].disk_bytes, 0);
    EXPECT_EQ(kv[0].policy, GetParam());
    EXPECT_EQ(kv[1].tokens, -1);
    EXPECT_EQ(kv[1].stored_tokens, -1);
    // Its blocks, as deltactl session describe asks (session_blocks, read_block): the record,
    // each block in both tiers, and a lease's holder while one lasts.
    auto blocks = decode_->session_blocks("s");
    ASSERT_TRUE(blocks.ok()) << blocks.status().to_string();
    const auto record = decode::decode_session_record(blocks->record);
    ASSERT_TRUE(record.has_value());
    EXPECT_EQ(record->tokens.size(), 107u);
    ASSERT_EQ(blocks->blocks.size(), record->keys.size());
    ASSERT_EQ(static_cast<int32_t>(blocks->blocks.size()), kv[0].blocks);
    int64_t disk_bytes = 0;
    for (const auto& b : blocks->blocks) {
        EXPECT_GT(b.disk_bytes, 0);
        EXPECT_EQ(b.host_bytes, b.disk_bytes);
        EXPECT_TRUE(b.leases.empty());
        disk_bytes += b.disk_bytes;
        auto whole = decode_->read_block(b.key, 0);
        ASSERT_TRUE(whole.ok()) << whole.status().to_string();
        EXPECT_EQ(static_cast<int64_t>(whole->size()), b.disk_bytes);
        EXPECT_EQ(decode_->read_block(b.key, 16)->size(), 16u);
    }
    EXPECT_EQ(disk_bytes, kv[0].disk_bytes);
    {
        auto lease = host_tier_->get(record->keys[0], "turn 99",
                                     kvstore::HostTier::Clock::now() + std::chrono::seconds(30));
        ASSERT_TRUE(lease.ok());
        auto leased = decode_->session_blocks("s");
        ASSERT_TRUE(leased.ok());
        ASSERT_EQ(leased->blocks[0].leases.size(), 1u);
        EXPECT_EQ(leased->blocks[0].leases[0].owner, "turn 99");
        EXPECT_GT(leased->blocks[0].leases[0].seconds_left, 20.0);
        EXPECT_LE(leased->blocks[0].leases[0].seconds_left, 30.0);
    }
    EXPECT_EQ(decode_->session_blocks("nobody").status().code(), StatusCode::kNotFound);
    EXPECT_EQ(decode_->read_block(12345, 0).status().code(), StatusCode::kNotFound);

    // Another worker on the same store (the process restarted): the session comes from disk.
    restart(true);
    auto resumed = run(testing::greedy_turn(4, text_tokens(140, 0, true), "s", 8));
    ASSERT_TRUE(resumed.ok()) << resumed.status().to_string();
    EXPECT_EQ(resumed->text, second->text);
    EXPECT_EQ(resumed->cached_tokens, second->cached_tokens);
    EXPECT_EQ(resumed->kv_source, "disk");
    const auto st = decode_->stats().tiers;
    EXPECT_EQ(st.promoted_disk, 1);
    EXPECT_EQ(st.load_seconds.count, 1);
    EXPECT_EQ(st.host_leases, 0) << "the turn's leases ended with the import";

    // Dropping the session forgets its record: its next turn is no resumption (full KV's
    // blocks stay as prefixes any turn may start from; DeltaKV's were the session's own).
    decode_->drop_session("s");
    restart(true);
    if (std::string(GetParam()) == "deltakv")
        EXPECT_EQ(disk_tier_->stats().blocks, 0u) << "the session's own blocks went with it";
    auto over = run(testing::greedy_turn(5, text_tokens(140, 0, true), "s", 8));
    ASSERT_TRUE(over.ok());
    EXPECT_EQ(decode_->stats().tiers.sessions_promoted(), 0);
    if (std::string(GetParam()) == "deltakv") {
        EXPECT_EQ(over->cached_tokens, 0);
    } else {
        EXPECT_EQ(decode_->stats().tiers.prefix_disk, 1);
    }
}

// A client that leaves right after its session came back from disk: the turn ends
// "cancelled", no lease on a stored block outlives it, and once the session is dropped the
// worker holds no KV (the pool back to its baseline) and the tiers hold what they held.
TEST_P(SessionStoreTest, ACancelledTurnLeavesNoLeaseAndNothingHeld) {
    restart(true);
    ASSERT_TRUE(run(testing::greedy_turn(1, text_tokens(150, 0, true), "s", 8)).ok());
    const uint64_t stored = disk_tier_->stats().blocks;
    restart(true);
    auto sink = std::make_shared<testing::CollectingSink>(/*cancel_after=*/1);
    ASSERT_TRUE(
        decode_->start_turn(testing::greedy_turn(2, text_tokens(170, 0, true), "s", 64), sink)
            .ok());
    auto end = sink->wait();
    ASSERT_TRUE(end.ok()) << end.status().to_string();
    EXPECT_EQ(end->finish_reason, "cancelled");
    EXPECT_EQ(end->kv_source, "disk");
    auto st = decode_->stats();
    EXPECT_EQ(st.tiers.host_leases, 0);
    EXPECT_EQ(st.kv_booked, 0);
    decode_->drop_session("s");
    st = decode_->stats();
    EXPECT_EQ(st.sessions, 0);
    EXPECT_EQ(st.kv_bytes, 0);
    EXPECT_EQ(st.kv_pool_used, 0);
    EXPECT_EQ(host_tier_->stats().leases, 0u);
    if (std::string(GetParam()) == "full") EXPECT_GE(disk_tier_->stats().blocks, stored);
}

// A pin on a session whose KV only the store holds (a restarted worker) brings it back into
// decode memory: its next turn takes it from there.
TEST_P(SessionStoreTest, APinBringsAStoredSessionBack) {
    restart(true);
    ASSERT_TRUE(run(testing::greedy_turn(1, text_tokens(100, 0, true), "s", 8)).ok());
    restart(true);
    EXPECT_EQ(decode_->session_kv({"s"})[0].tokens, -1) << "not in decode memory";
    ASSERT_TRUE(decode_->pin_session("s", true, "").ok());
    const auto kv = decode_->session_kv({"s"});
    EXPECT_EQ(kv[0].tokens, 107);
    EXPECT_TRUE(kv[0].pinned);
    auto next = run(testing::greedy_turn(2, text_tokens(140, 0, true), "s", 8));
    ASSERT_TRUE(next.ok()) << next.status().to_string();
    EXPECT_EQ(next->kv_source, "decode");
    EXPECT_EQ(decode_->pin_session("nobody", true, "").code(), StatusCode::kNotFound);
}

INSTANTIATE_TEST_SUITE_P(Policies, SessionStoreTest, ::testing::Values("full", "deltakv"));

}  // namespace
}  // namespace deltaserve
