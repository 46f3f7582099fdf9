// The disk tier on a disk that fills and frees (a real tmpfs of a few MiB, mounted in a mount
// namespace of the test's own), and on a damaged store: a flipped write-ahead log, a log cut
// short, an index deleted, a torn last write. Nothing crashes, nothing acknowledged is lost,
// and a damaged store is never opened silently.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "deltaserve/kvstore/disk_tier.h"

namespace deltaserve::kvstore {
namespace {

namespace fs = std::filesystem;

constexpr const char* kFullDiskEnv = "DELTASERVE_FULL_DISK_DIR";

std::vector<uint8_t> bytes_of(uint64_t key, size_t n) {
    std::vector<uint8_t> b(n);
    for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(key * 31 + i * 7);
    return b;
}

// Writes `n` bytes into `path` as far as the disk takes them (a filler).
void fill(const fs::path& path, size_t n) {
    std::ofstream out(path, std::ios::binary | std::ios::app);
    const std::string chunk(4096, 'f');
    for (size_t done = 0; done < n && out; done += chunk.size())
        out.write(chunk.data(), static_cast<std::streamsize>(std::min(chunk.size(), n - done)));
}

Result<std::unique_ptr<DiskTier>> open_tier(const fs::path& dir, uint64_t reserve) {
    DiskTier::Options o;
    o.dir = dir.string();
    o.capacity_bytes = uint64_t{1} << 30;  // the disk, not the cap, is what runs out
    o.reserve_bytes = reserve;
    return DiskTier::open(o);
}

// Runs this binary again as `filter` inside a new mount namespace (unshare -m), with
// kFullDiskEnv naming a directory the child mounts a small tmpfs on; the child's gtest
// result is this test's.
void run_in_mount_namespace(const std::string& filter) {
    if (::geteuid() != 0) GTEST_SKIP() << "mounting a small tmpfs needs root (CI runs as root)";
    if (std::system("unshare -m true 2>/dev/null") != 0)
        GTEST_SKIP() << "no mount namespaces here (unshare -m failed)";
    const std::string self = fs::read_symlink("/proc/self/exe").string();
    const fs::path dir = fs::temp_directory_path() / ("ds_full_disk_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    const std::string cmd = std::string(kFullDiskEnv) + "=" + dir.string() + " unshare -m " + self +
                            " --gtest_filter=" + filter + " 2>&1";
    FILE* p = ::popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    const int status = ::pclose(p);
    fs::remove_all(dir);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "the child (" << filter << ") failed or crashed (status " << status << "):\n"
        << out;
    EXPECT_NE(out.find("[  PASSED  ] 1 test"), std::string::npos) << out;
}

// In the child: a tmpfs of `mib` MiB on $DELTASERVE_FULL_DISK_DIR; false outside the child.
bool mount_small_disk(int mib, fs::path* dir) {
    const char* d = std::getenv(kFullDiskEnv);
    if (d == nullptr) return false;
    *dir = d;
    const std::string size = "size=" + std::to_string(mib) + "m";
    EXPECT_EQ(::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr), 0);
    EXPECT_EQ(::mount("tmpfs", d, "tmpfs", 0, size.c_str()), 0) << std::strerror(errno);
    return true;
}

// Every put answered OK is there, and every record written OK, after a reopen.
void expect_all_there(const fs::path& dir, const std::map<uint64_t, size_t>& blocks,
                      const std::map<std::string, std::string>& records) {
    auto t = open_tier(dir, 0);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    for (const auto& [k, n] : blocks) {
        auto b = (*t)->get(k);
        ASSERT_TRUE(b.ok()) << "block " << k << ": " << b.status().to_string();
        EXPECT_EQ(*b, bytes_of(k, n));
    }
    for (const auto& [k, v] : records) {
        auto r = (*t)->get_record(k);
        ASSERT_TRUE(r.ok() && r->has_value()) << "record " << k;
        EXPECT_EQ(**r, v);
    }
}

// Blocks of a session's turns with their records, on a disk filling up: a put is refused
// once the reserve is reached (kResourceExhausted, nothing stored, nothing crashes), records
// go on into the reserve's last half, and when the filler goes admission comes back. The
// filler's size moves the point where space runs out through every step of a turn's store
// (payload file, index write, record), three fill-and-free cycles each.
TEST(DiskTierFullDisk, Child_AFillingDiskStopsAdmissionAndSpaceBringsItBack) {
    fs::path dir;
    if (!mount_small_disk(12, &dir)) GTEST_SKIP() << "runs in the full-disk test's namespace";
    std::map<uint64_t, size_t> acknowledged;
    std::map<std::string, std::string> records;
    uint64_t key = 1;
    for (int cycle = 0; cycle < 3; ++cycle) {
        auto opened = open_tier(dir / "kv", 2 << 20);
        ASSERT_TRUE(opened.ok()) << opened.status().to_string();
        DiskTier& t = **opened;
        fill(dir / "filler", (5u << 20) + static_cast<size_t>(cycle) * 77777);
        bool refused = false;
        for (int turn = 0; turn < 200 && !refused; ++turn, ++key) {
            const size_t n = 150000 + (key * 7919) % 60000;
            const std::string rk = "ds/session-" + std::to_string(key % 5);
            const std::string rv = "turn " + std::to_string(turn) + " of cycle " +
                                   std::to_string(cycle) + std::string(900, 'h');
            const DiskTier::Record rec[] = {{rk, rv}};
            const Status st = t.put(key, bytes_of(key, n), rec);
            if (st.ok()) {
                acknowledged[key] = n;
                records[rk] = rv;
                continue;
            }
            ASSERT_EQ(st.code(), StatusCode::kResourceExhausted) << st.to_string();
            EXPECT_NE(st.message().find("the disk is full"), std::string::npos) << st.message();
            refused = true;
            EXPECT_TRUE(t.stats().records_writable);
            EXPECT_FALSE(t.contains(key));
            // The session's record still goes into the reserve.
            const DiskTier::Record small[] = {{"gw/session-" + std::to_string(cycle), rv}};
            ASSERT_TRUE(t.put_records(small).ok());
            records[small[0].first] = rv;
        }
        ASSERT_TRUE(refused) << "the disk never filled";
        // Filled to the last byte: records are refused by the gate, never by RocksDB.
        fill(dir / "filler", 64u << 20);
        const DiskTier::Record late[] = {{"gw/late", std::string(4096, 'l')}};
        EXPECT_EQ(t.put_records(late).code(), StatusCode::kResourceExhausted);
        EXPECT_EQ(t.put(key, bytes_of(key, 1000)).code(), StatusCode::kResourceExhausted);
        EXPECT_FALSE(t.stats().admitting);
        EXPECT_TRUE(t.stats().out_of_space);
        EXPECT_TRUE(t.stats().records_writable);
        // Space back: admission resumes without a restart.
        fs::remove(dir / "filler");
        EXPECT_TRUE(t.stats().admitting);
        ASSERT_TRUE(t.put(key, bytes_of(key, 1000)).ok());
        acknowledged[key++] = 1000;
        for (const auto& [k, n] : acknowledged) {
            if (!t.contains(k)) continue;  // (none is evicted: the cap is above the disk)
            EXPECT_EQ(*t.get(k), bytes_of(k, n));
        }
    }
    expect_all_there(dir / "kv", acknowledged, records);
}

// An index write that fails anyway (here the process's file size limit, which the
// free-space gate cannot see, as it cannot see EIO): the handle is poisoned (nothing writes,
// syncs or closes it again: Debian's RocksDB would abort), reads go on, the limit lifted
// changes nothing until a restart, and closing the tier does not crash. The restart then
// finds every record written before the failure.
TEST(DiskTierIndexFault, AnIndexWriteThatFailsPoisonsTheHandleAndNothingCrashes) {
    const fs::path dir = fs::temp_directory_path() / ("ds_poison_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    {
        auto opened = open_tier(dir, 0);
        ASSERT_TRUE(opened.ok()) << opened.status().to_string();
        DiskTier& t = **opened;
        ASSERT_TRUE(t.put(1, bytes_of(1, 5000)).ok());
        const DiskTier::Record first[] = {{"gw/a", "turn 1"}};
        ASSERT_TRUE(t.put_records(first).ok());
        struct rlimit old {};
        ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
        const auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
        struct rlimit small = old;
        small.rlim_cur = 64 << 10;
        ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
        Status st;
        for (int i = 0; i < 100 && st.ok(); ++i) {
            const DiskTier::Record rec[] = {{"gw/b" + std::to_string(i), std::string(20000, 'x')}};
            st = t.put_records(rec);
        }
        ::setrlimit(RLIMIT_FSIZE, &old);
        ::signal(SIGXFSZ, old_handler);
        ASSERT_FALSE(st.ok()) << "the index never failed";
        EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.to_string();
        EXPECT_FALSE(t.stats().records_writable);
        EXPECT_FALSE(t.stats().admitting);
        const DiskTier::Record again[] = {{"gw/c", "x"}};
        EXPECT_EQ(t.put_records(again).code(), StatusCode::kUnavailable);
        EXPECT_EQ(t.put(2, bytes_of(2, 10)).code(), StatusCode::kUnavailable);
        t.erase(1);  // does nothing, and does not crash
        ASSERT_TRUE(t.get(1).ok());
        EXPECT_EQ(*t.get(1), bytes_of(1, 5000));
        EXPECT_EQ(**t.get_record("gw/a"), "turn 1");
    }  // closed without an abort
    fs::remove_all(dir);
}

TEST(DiskTierFullDisk, AFillingDiskStopsAdmissionAndSpaceBringsItBack) {
    run_in_mount_namespace("DiskTierFullDisk.Child_AFillingDiskStopsAdmissionAndSpaceBringsItBack");
}

class DamagedStoreTest : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() /
               ("ds_damaged_" + std::to_string(::getpid()) + "_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(dir_);
        // Three turns of a session: its blocks and its record, each turn's record synced.
        auto t = open_tier(dir_, 0);
        ASSERT_TRUE(t.ok()) << t.status().to_string();
        for (uint64_t turn = 1; turn <= 3; ++turn) {
            const DiskTier::Record rec[] = {
                {"gw/s", "turn " + std::to_string(turn) + std::string(3000, 'c')}};
            ASSERT_TRUE((*t)->put(turn, bytes_of(turn, 20000), rec).ok());
        }
    }
    void TearDown() override { fs::remove_all(dir_); }

    fs::path log_file() const {
        for (const auto& f : fs::directory_iterator(dir_ / "index")) {
            if (f.path().extension() == ".log") return f.path();
        }
        return {};
    }
    // Opening fails with kDataLoss naming `what`, and changes nothing: twice the same.
    void expect_refused(const std::string& what) {
        for (int i = 0; i < 2; ++i) {
            auto t = open_tier(dir_, 0);
            ASSERT_FALSE(t.ok()) << "a damaged store was opened";
            EXPECT_EQ(t.status().code(), StatusCode::kDataLoss) << t.status().to_string();
            EXPECT_NE(t.status().message().find(what), std::string::npos) << t.status().to_string();
        }
        size_t files = 0;
        for (const auto& f : fs::directory_iterator(dir_ / "payload")) files += f.is_regular_file();
        EXPECT_EQ(files, 3u) << "the blocks were touched";
    }

    fs::path dir_;
};

TEST_F(DamagedStoreTest, FlippedBytesInTheLogAreRefusedNotRolledBack) {
    const fs::path log = log_file();
    ASSERT_FALSE(log.empty());
    const auto size = fs::file_size(log);
    ASSERT_GT(size, 9000u);
    std::fstream f(log, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size / 2));
    const std::string junk(32, '\x5a');
    f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
    f.close();
    expect_refused("index");
}

TEST_F(DamagedStoreTest, ALogCutShortIsRefused) {
    const fs::path log = log_file();
    ASSERT_FALSE(log.empty());
    fs::resize_file(log, fs::file_size(log) / 2);
    expect_refused("index");
}

TEST_F(DamagedStoreTest, ALogCutAtARecordBoundaryIsRefusedByTheCommitRecord) {
    // Replayed up to its first turn's record only: what RocksDB cannot see.
    const fs::path log = log_file();
    ASSERT_FALSE(log.empty());
    fs::resize_file(log, 0);
    expect_refused("lost acknowledged writes");
}

TEST_F(DamagedStoreTest, ADeletedIndexIsRefusedAndTheBlocksKept) {
    fs::remove_all(dir_ / "index");
    expect_refused("is missing");
}

TEST_F(DamagedStoreTest, ATornLastWriteIsTakenWithEverythingAcknowledged) {
    // What a crash in the middle of appending the next record leaves: a partial record at
    // the log's end (a header that promises more than is there).
    const fs::path log = log_file();
    ASSERT_FALSE(log.empty());
    {
        std::ofstream f(log, std::ios::binary | std::ios::app);
        const char partial[] = {'\x11', '\x22', '\x33', '\x44', '\x00', '\x40', '\x01', 'a', 'b'};
        f.write(partial, sizeof partial);
    }
    auto t = open_tier(dir_, 0);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    EXPECT_EQ((**(*t)->get_record("gw/s")).substr(0, 6), "turn 3");
    for (uint64_t k = 1; k <= 3; ++k) EXPECT_EQ(*(*t)->get(k), bytes_of(k, 20000));
}

}  // namespace
}  // namespace deltaserve::kvstore
