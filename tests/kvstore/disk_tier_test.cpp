// The disk tier against a real RocksDB index and real files: restarts, crashes (kill -9 of a
// writing process), cut and stray files, the cap, and I/O errors.
#include "deltaserve/kvstore/disk_tier.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace deltaserve::kvstore {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// The bytes a test stores under a key: recognisable, and of the key's own length.
std::vector<uint8_t> bytes_of(uint64_t key, size_t n) {
    std::vector<uint8_t> b(n);
    for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(key * 31 + i * 7);
    return b;
}

class DiskTierTest : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() /
               ("ds_disk_tier_" + std::to_string(::getpid()) + "_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }

    std::unique_ptr<DiskTier> open(uint64_t capacity = 1 << 20) {
        DiskTier::Options o;
        o.dir = dir_.string();
        o.capacity_bytes = capacity;
        auto t = DiskTier::open(o);
        EXPECT_TRUE(t.ok()) << t.status().to_string();
        return t.ok() ? std::move(*t) : nullptr;
    }

    fs::path dir_;
};

TEST_F(DiskTierTest, BlocksAndRecordsSurviveAReopen) {
    {
        auto t = open();
        ASSERT_TRUE(t->put(1, bytes_of(1, 1000)).ok());
        const DiskTier::Record recs[] = {{"session/a", "turns 1"}, {"session/b", "turns 2"}};
        ASSERT_TRUE(t->put(2, bytes_of(2, 3000), recs).ok());
        ASSERT_TRUE(t->put(1, bytes_of(1, 500)).ok());  // replaced
        EXPECT_EQ(t->stats().bytes, 3500u);
    }
    auto t = open();
    const auto s = t->stats();
    EXPECT_EQ(s.blocks, 2u);
    EXPECT_EQ(s.bytes, 3500u);
    EXPECT_EQ(s.orphans_removed, 0u);
    EXPECT_GE(s.recovery_ms, 0.0);
    auto one = t->get(1);
    ASSERT_TRUE(one.ok());
    EXPECT_EQ(*one, bytes_of(1, 500));
    EXPECT_EQ(*t->get(2), bytes_of(2, 3000));
    EXPECT_EQ(t->get(3).status().code(), StatusCode::kNotFound);
    EXPECT_EQ(**t->get_record("session/a"), "turns 1");
    auto all = t->records("session/");
    ASSERT_TRUE(all.ok());
    ASSERT_EQ(all->size(), 2u);
    EXPECT_EQ((*all)[1].first, "session/b");
    const DiskTier::Record drop[] = {{"session/a", ""}};
    ASSERT_TRUE(t->put_records(drop).ok());
    EXPECT_FALSE(t->get_record("session/a")->has_value());
    // One payload file per block.
    size_t files = 0;
    for (const auto& f : fs::directory_iterator(dir_ / "payload")) files += f.is_regular_file();
    EXPECT_EQ(files, 2u);
}

// The least recently written (or read) blocks make room; a block over the cap is refused.
TEST_F(DiskTierTest, TheCapEvictsTheLeastRecentlyUsed) {
    auto t = open(3000);
    for (uint64_t k : {1, 2, 3}) ASSERT_TRUE(t->put(k, bytes_of(k, 1000)).ok());
    ASSERT_TRUE(t->get(1).ok());
    ASSERT_TRUE(t->put(4, bytes_of(4, 1500)).ok());  // 2 and 3 go
    EXPECT_TRUE(t->contains(1));
    EXPECT_FALSE(t->contains(2));
    EXPECT_FALSE(t->contains(3));
    EXPECT_EQ(t->stats().evictions, 2u);
    EXPECT_EQ(t->put(5, bytes_of(5, 3001)).code(), StatusCode::kResourceExhausted);
    EXPECT_TRUE(t->contains(1) && t->contains(4));
    t.reset();
    t = open(3000);
    EXPECT_EQ(t->stats().bytes, 2500u);
    EXPECT_FALSE(t->contains(2));
    // The evictions were committed with the put: nothing for recovery to mend.
    EXPECT_EQ(t->stats().entries_lost, 0u);
    EXPECT_EQ(t->stats().orphans_removed, 0u);
}

// A put cut short leaves a file the index does not name; a file removed under the index
// leaves an entry without one: open() removes both. A file cut short is refused on read.
TEST_F(DiskTierTest, RecoveryRemovesStrayFilesAndLostEntries) {
    {
        auto t = open();
        for (uint64_t k : {1, 2, 3}) ASSERT_TRUE(t->put(k, bytes_of(k, 100)).ok());
    }
    std::ofstream(dir_ / "payload" / "00000000000000ff-00000099.blk") << "half a put";
    std::ofstream(dir_ / "payload" / "not-ours.tmp") << "x";
    for (const auto& f : fs::directory_iterator(dir_ / "payload")) {
        if (f.path().filename().string().rfind("0000000000000002-", 0) == 0) fs::remove(f.path());
    }
    auto t = open();
    EXPECT_EQ(t->stats().orphans_removed, 2u);
    EXPECT_EQ(t->stats().entries_lost, 1u);
    EXPECT_FALSE(t->contains(2));
    EXPECT_EQ(t->stats().bytes, 200u);
    // Cut one short under the running tier: kDataLoss, and it is dropped.
    for (const auto& f : fs::directory_iterator(dir_ / "payload")) {
        if (f.path().filename().string().rfind("0000000000000003-", 0) == 0)
            fs::resize_file(f.path(), 10);
    }
    EXPECT_EQ(t->get(3).status().code(), StatusCode::kDataLoss);
    EXPECT_FALSE(t->contains(3));
    EXPECT_EQ(t->stats().dropped, 1u);
    EXPECT_EQ(*t->get(1), bytes_of(1, 100));
}

// Every removal is logged with its time and reason in the commit that makes it, kept across
// a reopen, the oldest going beyond removals_kept.
TEST_F(DiskTierTest, RemovalsAreLoggedWithTheirReason) {
    const auto before = std::chrono::system_clock::now();
    const auto reasons = [](const DiskTier& t) {
        std::vector<std::pair<uint64_t, std::string>> out;
        auto r = t.removals();
        EXPECT_TRUE(r.ok()) << r.status().to_string();
        for (const auto& e : r.ok() ? *r : std::vector<DiskTier::Removal>{})
            out.emplace_back(e.key, e.reason);
        return out;
    };
    {
        auto t = open(3000);
        for (uint64_t k : {1, 2, 3}) ASSERT_TRUE(t->put(k, bytes_of(k, 1000)).ok());
        ASSERT_TRUE(t->put(4, bytes_of(4, 1000)).ok());  // 1 goes: the cap
        t->erase(2, /*refused=*/true);
        t->erase(3);
        t->erase(99);  // not held: nothing to log
        using R = std::vector<std::pair<uint64_t, std::string>>;
        EXPECT_EQ(reasons(*t), (R{{1, "cap"}, {2, "refused"}, {3, "erased"}}));
        const auto all = *t->removals();
        EXPECT_EQ(all[0].bytes, 1000u);
        const int64_t t0 =
            std::chrono::duration_cast<std::chrono::milliseconds>(before.time_since_epoch())
                .count();
        EXPECT_GE(all[0].unix_ms, t0);
        EXPECT_LE(all[0].unix_ms, t0 + 60000);
        // Records of other kinds are not removals, and stored bytes that do not parse as one
        // (written over by hand, or by another version) are skipped.
        const std::string hex32(32, 'a');
        const DiskTier::Record rec[] = {{"ds/x", "y"},
                                        {"ev/zz", "cap 1"},
                                        {"ev/" + hex32, "cap"},
                                        {"ev/" + hex32.substr(1) + "g", "cap 1"},
                                        {"ev/" + hex32 + "0", "cap 1"},
                                        {"ev/" + std::string(32, 'f'), "cap 12x"},
                                        {"ev/" + std::string(32, 'b'), " "}};
        ASSERT_TRUE(t->put_records(rec).ok());
        EXPECT_EQ(reasons(*t), (R{{1, "cap"}, {2, "refused"}, {3, "erased"}}));
        const DiskTier::Record junk[] = {{"ev/zz", ""},
                                         {"ev/" + hex32, ""},
                                         {"ev/" + hex32.substr(1) + "g", ""},
                                         {"ev/" + hex32 + "0", ""},
                                         {"ev/" + std::string(32, 'f'), ""},
                                         {"ev/" + std::string(32, 'b'), ""}};
        ASSERT_TRUE(t->put_records(junk).ok());
    }
    // A file gone at open: "lost". The log survives the reopen, and a read-only open reads it.
    for (const auto& f : fs::directory_iterator(dir_ / "payload")) fs::remove(f.path());
    {
        auto t = open(3000);
        EXPECT_EQ(reasons(*t).size(), 4u);
        EXPECT_EQ(reasons(*t).back(), std::make_pair(uint64_t{4}, std::string("lost")));
    }
    DiskTier::Options o;
    o.dir = dir_.string();
    o.read_only = true;
    auto ro = DiskTier::open(o);
    ASSERT_TRUE(ro.ok());
    EXPECT_EQ(reasons(**ro).size(), 4u);
    ro->reset();
    // Only the last removals_kept are kept.
    o.read_only = false;
    o.capacity_bytes = 1000;
    o.removals_kept = 3;
    auto t = DiskTier::open(o);
    ASSERT_TRUE(t.ok());
    for (uint64_t k = 10; k < 16; ++k) ASSERT_TRUE((*t)->put(k, bytes_of(k, 1000)).ok());
    const auto kept = reasons(**t);
    ASSERT_EQ(kept.size(), 3u);
    EXPECT_EQ(kept[0].first, 12u);
    EXPECT_EQ(kept[2].first, 14u);
}

// A write that fails (here the process's file size limit, as a full disk would) stops
// admission; reads go on, and nothing half-written is left.
TEST_F(DiskTierTest, AnIoErrorStopsAdmissionAndReadsGoOn) {
    auto t = open();
    ASSERT_TRUE(t->put(1, bytes_of(1, 1000)).ok());
    struct rlimit old {};
    ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
    const auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = old;
    small.rlim_cur = 4096;
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
    const Status failed = t->put(2, bytes_of(2, 100000));
    ::setrlimit(RLIMIT_FSIZE, &old);
    ::signal(SIGXFSZ, old_handler);
    EXPECT_EQ(failed.code(), StatusCode::kUnavailable) << failed.to_string();
    const auto s = t->stats();
    EXPECT_FALSE(s.admitting);
    EXPECT_EQ(s.io_errors, 1u);
    EXPECT_NE(s.last_error.find("writing"), std::string::npos) << s.last_error;
    EXPECT_EQ(t->put(3, bytes_of(3, 10)).code(), StatusCode::kUnavailable);
    EXPECT_FALSE(t->contains(2));
    EXPECT_EQ(*t->get(1), bytes_of(1, 1000));
    size_t files = 0;
    for (const auto& f : fs::directory_iterator(dir_ / "payload")) files += f.is_regular_file();
    EXPECT_EQ(files, 1u);
}

// The writer of the kill -9 test: this test binary started again (a fresh process, not a fork
// of one whose threads RocksDB started), writing blocks into $DELTASERVE_DISK_WRITER_DIR until
// it is killed.
TEST(DiskTierWriter, RunsOnlyAsTheKillTestsChild) {
    const char* dir = std::getenv("DELTASERVE_DISK_WRITER_DIR");
    if (dir == nullptr) GTEST_SKIP() << "the kill -9 test's writer process: runs as its child only";
    const uint64_t round = std::strtoull(std::getenv("DELTASERVE_DISK_WRITER_ROUND"), nullptr, 10);
    DiskTier::Options o;
    o.dir = dir;
    o.capacity_bytes = 4 << 20;
    auto t = DiskTier::open(o);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    for (uint64_t i = 0;; ++i) {
        const uint64_t key = (i * 13 + round) % 64;
        const DiskTier::Record rec[] = {{"last", std::to_string(key)}};
        (void)(*t)->put(key, bytes_of(key, 20000 + key * 1000), rec);
    }
}

// A process writing blocks is killed (SIGKILL) mid-stream, several times: after each restart
// every block the index names reads back whole and right, and no stray file is left.
TEST_F(DiskTierTest, KillNineWhileWritingRecoversExactly) {
    for (int round = 0; round < 3; ++round) {
        const std::string dir_env = "DELTASERVE_DISK_WRITER_DIR=" + dir_.string();
        const std::string round_env = "DELTASERVE_DISK_WRITER_ROUND=" + std::to_string(round);
        const pid_t child = ::fork();
        ASSERT_GE(child, 0);
        if (child == 0) {
            char filter[] = "--gtest_filter=DiskTierWriter.RunsOnlyAsTheKillTestsChild";
            char self[] = "/proc/self/exe";
            char* argv[] = {self, filter, nullptr};
            char* envp[] = {const_cast<char*>(dir_env.c_str()),
                            const_cast<char*>(round_env.c_str()), nullptr};
            ::execve(self, argv, envp);
            ::_exit(127);
        }
        // Killed once it is writing (its start takes longer under the sanitizers), at a
        // different point each round.
        const auto payload_files = [&] {
            size_t n = 0;
            std::error_code ec;
            for (const auto& f : fs::directory_iterator(dir_ / "payload", ec))
                n += f.is_regular_file();
            return n;
        };
        for (int i = 0; i < 2000 && payload_files() < 8; ++i) std::this_thread::sleep_for(10ms);
        std::this_thread::sleep_for(std::chrono::milliseconds(50 + 70 * round));
        ::kill(child, SIGKILL);
        int status = 0;
        ::waitpid(child, &status, 0);
        ASSERT_TRUE(WIFSIGNALED(status)) << "the writer exited on its own: " << status;
        auto t = open(4 << 20);
        ASSERT_NE(t, nullptr);
        const auto keys = t->keys();
        EXPECT_FALSE(keys.empty()) << "round " << round;
        for (uint64_t k : keys) {
            auto b = t->get(k);
            ASSERT_TRUE(b.ok()) << b.status().to_string();
            EXPECT_EQ(*b, bytes_of(k, 20000 + k * 1000)) << "key " << k << ", round " << round;
        }
        size_t files = 0;
        for (const auto& f : fs::directory_iterator(dir_ / "payload")) files += f.is_regular_file();
        EXPECT_EQ(files, keys.size()) << "round " << round;
        EXPECT_LE(t->stats().bytes, 4u << 20);
    }
}

}  // namespace
}  // namespace deltaserve::kvstore
