// The disk tier's store (kvstore/disk_tier.h) on this disk: bench/run_tier_bench.py drives it
// beside RocksDB's own db_bench.
//
//   store:    puts --total bytes of blocks of each --sizes value, then gets them all back in
//             random order; MB/s both ways. The same through RocksDB alone with the values in
//             its blob files (enable_blob_files: RocksDB's design for large values), the other
//             layout issue 36 asks to measure.
//   populate: writes --sessions sessions as a server leaves them (a gateway record with a
//             four-message history, the decode worker's record and one 64 KiB block each),
//             for `deltaserve serve --data-dir` to recover.
// One JSON object per line on stdout.
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "deltaserve/common/args.h"
#include "deltaserve/common/byte_size.h"
#include "deltaserve/kvstore/disk_tier.h"

namespace {

using deltaserve::kvstore::DiskTier;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Drops the page cache where allowed (root), so reads come from the disk; false otherwise.
bool drop_page_cache() {
    ::sync();  // dirty pages are not dropped: written back first
    std::FILE* f = std::fopen("/proc/sys/vm/drop_caches", "w");
    if (f == nullptr) return false;
    const bool ok = std::fputs("3\n", f) >= 0;
    return std::fclose(f) == 0 && ok;
}

std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
    std::vector<uint8_t> v(n);
    std::mt19937_64 rng(seed);
    for (size_t i = 0; i + 8 <= n; i += 8) {
        const uint64_t x = rng();
        std::memcpy(v.data() + i, &x, 8);
    }
    return v;
}

int store(const std::string& dir, const std::vector<uint64_t>& sizes, uint64_t total, bool sync) {
    const bool dropped = drop_page_cache();
    for (uint64_t size : sizes) {
        const int n = static_cast<int>(std::max<uint64_t>(4, total / size));
        const std::vector<uint8_t> value = random_bytes(size, size);
        std::vector<int> order(static_cast<size_t>(n));
        for (int i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
        std::shuffle(order.begin(), order.end(), std::mt19937(7));
        const double mb = static_cast<double>(size) * n / 1e6;
        nlohmann::json out = {{"size", size}, {"blocks", n}, {"page_cache_dropped", dropped}};
        {  // the disk tier: a payload file per block, the index in RocksDB
            fs::remove_all(dir);
            DiskTier::Options o;
            o.dir = dir;
            o.capacity_bytes = uint64_t{1} << 50;
            o.sync = sync;
            auto tier = DiskTier::open(o);
            if (!tier.ok()) {
                std::fprintf(stderr, "error: %s\n", tier.status().to_string().c_str());
                return 1;
            }
            auto t0 = Clock::now();
            for (int i = 0; i < n; ++i) {
                if (!(*tier)->put(static_cast<uint64_t>(i) + 1, value).ok()) return 1;
            }
            out["tier_write_mbps"] = mb / seconds_since(t0);
            if (dropped) drop_page_cache();
            t0 = Clock::now();
            for (int i : order) {
                auto got = (*tier)->get(static_cast<uint64_t>(i) + 1);
                if (!got.ok() || got->size() != size) return 1;
            }
            out["tier_read_mbps"] = mb / seconds_since(t0);
        }
        {  // RocksDB alone, values in its blob files
            fs::remove_all(dir);
            rocksdb::Options o;
            o.create_if_missing = true;
            o.enable_blob_files = true;
            o.min_blob_size = 0;
            o.compression = rocksdb::kNoCompression;
            o.blob_compression_type = rocksdb::kNoCompression;
            rocksdb::DB* raw = nullptr;
            if (!rocksdb::DB::Open(o, dir, &raw).ok()) return 1;
            std::unique_ptr<rocksdb::DB> db(raw);
            rocksdb::WriteOptions w;
            w.sync = sync;
            const rocksdb::Slice v(reinterpret_cast<const char*>(value.data()), value.size());
            auto t0 = Clock::now();
            for (int i = 0; i < n; ++i) {
                if (!db->Put(w, std::to_string(i), v).ok()) return 1;
            }
            if (!db->Flush(rocksdb::FlushOptions()).ok()) return 1;
            out["blob_write_mbps"] = mb / seconds_since(t0);
            if (dropped) drop_page_cache();
            t0 = Clock::now();
            std::string got;
            for (int i : order) {
                if (!db->Get(rocksdb::ReadOptions(), std::to_string(i), &got).ok() ||
                    got.size() != size)
                    return 1;
            }
            out["blob_read_mbps"] = mb / seconds_since(t0);
        }
        fs::remove_all(dir);
        std::printf("%s\n", out.dump().c_str());
        std::fflush(stdout);
    }
    return 0;
}

int populate(const std::string& dir, int sessions) {
    DiskTier::Options o;
    o.dir = (fs::path(dir) / "kv").string();
    o.capacity_bytes = uint64_t{1} << 50;
    auto tier = DiskTier::open(o);
    if (!tier.ok()) {
        std::fprintf(stderr, "error: %s\n", tier.status().to_string().c_str());
        return 1;
    }
    const std::vector<uint8_t> block = random_bytes(64 << 10, 1);
    const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
    const std::string text(200, 'x');
    const auto t0 = Clock::now();
    for (int i = 0; i < sessions; ++i) {
        const std::string id = "bench-" + std::to_string(i);
        nlohmann::json history = nlohmann::json::array();
        for (int m = 0; m < 4; ++m)
            history.push_back({{"role", m % 2 == 0 ? "user" : "assistant"}, {"content", text}});
        const nlohmann::json g = {{"v", 1},
                                  {"tenant", ""},
                                  {"id", id},
                                  {"node", "decode-0"},
                                  {"turns", 2},
                                  {"tokens", 512},
                                  {"cached_tokens", 256},
                                  {"last_used", now},
                                  {"history", history}};
        // The decode worker's record is read when the session's next turn comes, not at
        // start: its bytes here stand for its size only.
        const DiskTier::Record records[] = {{"gw//" + id, g.dump()},
                                            {"ds/0000000000000000/" + id, std::string(2100, 'r')}};
        if (!(*tier)->put(static_cast<uint64_t>(i) + 1, block, records).ok()) return 1;
    }
    std::printf(
        "%s\n",
        nlohmann::json({{"sessions", sessions}, {"seconds", seconds_since(t0)}}).dump().c_str());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    std::string mode = "store", dir, sizes_flag = "1MiB,8MiB,32MiB,80MiB", total_flag = "1GiB";
    int32_t sessions = 1000;
    bool sync = false;
    deltaserve::ArgParser p("deltaserve-bench-tier-store",
                            "The disk tier's write and read throughput and a populated data "
                            "dir for recovery (bench/run_tier_bench.py)");
    p.add("mode", &mode, "store or populate");
    p.add("dir", &dir, "a directory on the disk to measure (emptied)");
    p.add("sizes", &sizes_flag, "block sizes (store)");
    p.add("total", &total_flag, "bytes written per size (store)");
    p.add("sessions", &sessions, "sessions written (populate)");
    p.add_switch("sync", &sync, "fdatasync every block (store)");
    if (auto code = deltaserve::parse_flags(p, argc - 1, argv + 1)) return *code;
    if (dir.empty()) {
        std::fprintf(stderr, "error: --dir is required\n");
        return 2;
    }
    if (mode == "populate") return populate(dir, sessions);
    std::vector<uint64_t> sizes;
    size_t at = 0;
    while (at <= sizes_flag.size()) {
        const size_t comma = std::min(sizes_flag.find(',', at), sizes_flag.size());
        auto s = deltaserve::parse_byte_size(sizes_flag.substr(at, comma - at));
        if (!s.ok()) {
            std::fprintf(stderr, "error: --sizes: %s\n", s.status().to_string().c_str());
            return 2;
        }
        sizes.push_back(*s);
        at = comma + 1;
    }
    auto total = deltaserve::parse_byte_size(total_flag);
    if (!total.ok()) return 2;
    return store(dir, sizes, *total, sync);
}
