#include "data_dir.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include <unistd.h>

#include "deltaserve/common/chain_hash.h"
#include "deltaserve/common/crc32c.h"

namespace deltaserve::cli {

namespace fs = std::filesystem;

namespace {

// The file's size and CRC-32C, into h.
Status hash_file(const fs::path& path, uint64_t& h) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return not_found("cannot read " + path.string());
    std::vector<uint8_t> buf(size_t{4} << 20);
    uint32_t crc = 0;
    uint64_t size = 0;
    while (in) {
        in.read(reinterpret_cast<char*>(buf.data()), static_cast<std::streamsize>(buf.size()));
        const auto got = static_cast<size_t>(in.gcount());
        crc = crc32c(std::span<const uint8_t>(buf.data(), got), crc);
        size += got;
    }
    h = hash_mix(hash_mix(hash_string(h, path.filename().string()), size), crc);
    return Status();
}

}  // namespace

uint64_t default_host_tier_bytes() {
    return static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) *
           static_cast<uint64_t>(::sysconf(_SC_PAGE_SIZE)) / 8;
}

Result<std::shared_ptr<kvstore::DiskTier>> open_data_dir(const std::string& dir, uint64_t capacity,
                                                         uint64_t reserve) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) return unavailable("--data-dir " + dir + ": " + ec.message());
    if (capacity == 0) {
        const auto space = fs::space(dir, ec);
        if (ec) return unavailable("--data-dir " + dir + ": " + ec.message());
        capacity = std::min<uint64_t>(space.available / 2, uint64_t{64} << 30);
    }
    kvstore::DiskTier::Options o;
    o.dir = (fs::path(dir) / "kv").string();
    o.capacity_bytes = capacity;
    o.reserve_bytes = reserve;
    auto tier = kvstore::DiskTier::open(o);
    if (!tier.ok()) {
        // Another process holding RocksDB's lock is named by its pid; any other failure is
        // the store's own (its message says what), never blamed on a server that is not there.
        if (const int64_t pid = kvstore::DiskTier::holder(o.dir)) {
            return unavailable("--data-dir " + dir +
                               ": the store is in use by another process (pid " +
                               std::to_string(pid) + "): give each server its own data dir");
        }
        if (tier.status().code() == StatusCode::kDataLoss) {
            return data_loss("--data-dir " + dir + ": " + tier.status().message() +
                             ". Nothing was changed. `deltactl verify --data-dir " + dir +
                             "` lists the damage; `deltactl repair --data-dir " + dir +
                             "` rebuilds the index from the blocks and the records it can read");
        }
        return Status(tier.status().code(), "--data-dir " + dir + ": " + tier.status().message());
    }
    return std::shared_ptr<kvstore::DiskTier>(std::move(*tier));
}

Result<std::string> store_identity(const std::string& model_path, const std::string& tokenizer_path,
                                   const model::ContextOptions& context) {
    uint64_t h = hash_string(0, "deltaserve store identity 1");
    const fs::path model(model_path);
    std::error_code ec;
    if (fs::is_directory(model, ec)) {  // a Hugging Face directory: its files, in name order
        std::vector<fs::path> files;
        for (const auto& e : fs::directory_iterator(model, ec)) {
            if (e.is_regular_file()) files.push_back(e.path());
        }
        std::sort(files.begin(), files.end());
        for (const auto& f : files) DS_RETURN_IF_ERROR(hash_file(f, h));
    } else {
        DS_RETURN_IF_ERROR(hash_file(model, h));
    }
    h = hash_string(h, "tokenizer");
    if (!tokenizer_path.empty()) DS_RETURN_IF_ERROR(hash_file(tokenizer_path, h));
    h = hash_string(h, "profile");
    if (!context.kv_profile.empty()) DS_RETURN_IF_ERROR(hash_file(context.kv_profile, h));
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
    return std::string(hex);
}

}  // namespace deltaserve::cli
