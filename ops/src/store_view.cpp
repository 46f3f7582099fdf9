#include "store_view.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

namespace deltaserve::ops {

namespace fs = std::filesystem;

namespace {

// The fingerprint field of a block (kv_block.h: offset 16), so that any store can be read.
uint64_t fingerprint_of(std::span<const uint8_t> bytes) {
    uint64_t fp = 0;
    if (bytes.size() >= 24) std::memcpy(&fp, bytes.data() + 16, 8);
    return fp;
}

void split_key(const std::string& key, std::string* tenant, std::string* id) {
    const size_t slash = key.rfind('/');  // ids hold no '/'
    *tenant = slash == std::string::npos ? "" : key.substr(0, slash);
    *id = slash == std::string::npos ? key : key.substr(slash + 1);
}

}  // namespace

Result<kvstore::KvBlockMeta> parse_any_block_header(std::span<const uint8_t> bytes,
                                                    std::string* fault) {
    kvstore::KvBlockFault f = kvstore::KvBlockFault::kNone;
    auto m = kvstore::parse_kv_block_header(bytes, fingerprint_of(bytes), &f);
    if (!m.ok() && fault != nullptr) *fault = std::string(kvstore::kv_block_fault_name(f));
    return m;
}

Result<kvstore::KvBlockView> parse_any_block(std::span<const uint8_t> bytes, std::string* fault) {
    kvstore::KvBlockFault f = kvstore::KvBlockFault::kNone;
    auto v = kvstore::parse_kv_block(bytes, fingerprint_of(bytes), &f);
    if (!v.ok() && fault != nullptr) *fault = std::string(kvstore::kv_block_fault_name(f));
    return v;
}

Result<std::vector<std::pair<std::string, std::string>>> find_stores(const std::string& data_dir) {
    std::error_code ec;
    if (!fs::is_directory(data_dir, ec)) return not_found("no directory " + data_dir);
    // DIR a store itself, DIR/kv, or DIR/<node>/kv; a store whose index is gone still has
    // its payload folder.
    std::vector<std::pair<std::string, std::string>> found;  // name, dir
    const auto is_store = [&](const fs::path& p) {
        return fs::is_directory(p / "index", ec) || fs::is_directory(p / "payload", ec);
    };
    if (is_store(data_dir)) {
        found.emplace_back("", data_dir);
    } else if (is_store(fs::path(data_dir) / "kv")) {
        found.emplace_back("", (fs::path(data_dir) / "kv").string());
    } else {
        for (const auto& e : fs::directory_iterator(data_dir, ec)) {
            if (e.is_directory(ec) && is_store(e.path() / "kv"))
                found.emplace_back(e.path().filename().string(), (e.path() / "kv").string());
        }
        std::sort(found.begin(), found.end());
    }
    if (found.empty()) {
        return not_found("no store in " + data_dir +
                         " (a data dir holds kv/, or a folder per node with kv/ in it)");
    }
    return found;
}

Result<std::unique_ptr<StoreView>> StoreView::open(const std::string& data_dir, bool writable) {
    DS_ASSIGN_OR_RETURN(auto found, find_stores(data_dir));
    auto view = std::make_unique<StoreView>();
    for (const auto& [name, dir] : found) {
        if (const int64_t pid = kvstore::DiskTier::holder(dir)) {
            return failed_precondition(
                "the store in " + dir + " is open in a running server (pid " + std::to_string(pid) +
                "): ask that server (--server HOST:PORT), or open a checkpoint of it");
        }
        kvstore::DiskTier::Options o;
        o.dir = dir;
        o.read_only = !writable;
        o.capacity_bytes = UINT64_MAX;
        auto tier = kvstore::DiskTier::open(o);
        if (!tier.ok()) {
            if (tier.status().code() != StatusCode::kDataLoss)
                return unavailable(tier.status().message());
            return data_loss(tier.status().message() + ". `deltactl repair --data-dir " + data_dir +
                             "` rebuilds its index from its blocks and the records it "
                             "can read");
        }
        view->stores_.push_back(std::unique_ptr<Store>(new Store{name, dir, std::move(*tier)}));
    }
    return view;
}

std::vector<StoredSession> StoreView::sessions() {
    unreadable_ = 0;
    std::map<std::string, StoredSession> by_key;
    for (const auto& store : stores_) {
        auto gw = store->tier->records("gw/");
        if (gw.ok()) {
            for (const auto& [k, v] : *gw) {
                const std::string key = k.substr(3);
                try {
                    const auto j = nlohmann::json::parse(v);
                    StoredSession& s = by_key[key];
                    s.key = key;
                    s.has_gateway_record = true;
                    s.tenant = j.at("tenant").get<std::string>();
                    s.id = j.at("id").get<std::string>();
                    s.node = j.at("node").get<std::string>();
                    s.turns = j.at("turns").get<int32_t>();
                    s.tokens = j.at("tokens").get<int64_t>();
                    s.last_used = j.at("last_used").get<int64_t>();
                    s.messages = static_cast<int32_t>(j.at("history").size());
                } catch (const std::exception&) {
                    ++unreadable_;
                }
            }
        } else {
            ++unreadable_;
        }
        auto ds = store->tier->records("ds/");
        if (!ds.ok()) {
            ++unreadable_;
            continue;
        }
        for (const auto& [k, v] : *ds) {
            uint64_t fp = 0;
            std::string key;
            auto record = decode::decode_session_record(v);
            if (!decode::parse_session_record_key(k, &fp, &key) || !record) {
                ++unreadable_;
                continue;
            }
            StoredSession& s = by_key[key];
            s.key = key;
            if (!s.has_gateway_record) split_key(key, &s.tenant, &s.id);
            if (s.has_kv_record) {  // one more, of another KV identity: the first stays
                s.other_fingerprints.push_back(fp);
                continue;
            }
            s.has_kv_record = true;
            s.store = store.get();
            s.fingerprint = fp;
            s.record = std::move(*record);
        }
    }
    std::vector<StoredSession> out;
    for (auto& [key, s] : by_key) {
        for (uint64_t k : s.has_kv_record ? s.record.keys : std::vector<uint64_t>()) {
            if (auto size = s.store->tier->size_of(k)) {
                s.disk_bytes += *size;
                ++s.blocks_held;
            }
        }
        out.push_back(std::move(s));
    }
    return out;
}

Result<StoredSession> StoreView::session(const std::string& key_or_id) {
    std::vector<StoredSession> all = sessions();
    std::vector<StoredSession*> match;
    for (auto& s : all) {
        if (s.key == key_or_id) return std::move(s);
        if (s.id == key_or_id) match.push_back(&s);
    }
    if (match.size() == 1) return std::move(*match[0]);
    if (match.empty()) return not_found("no session " + key_or_id + " in the store");
    return invalid_argument("session id " + key_or_id + " is held by " +
                            std::to_string(match.size()) + " tenants: name it as TENANT/ID");
}

Result<std::vector<uint8_t>> StoreView::read_block(const Store& store, uint64_t key) const {
    return store.tier->peek(key, UINT64_MAX);
}

Result<kvstore::KvBlockMeta> StoreView::read_header(const Store& store, uint64_t key,
                                                    std::string* fault) const {
    // A header of a short block fits in 64 KiB; a longer one is read whole (kv_block.h: its
    // size is at offset 8).
    auto bytes = store.tier->peek(key, 64 << 10);
    if (bytes.ok() && bytes->size() >= 12) {
        uint32_t header = 0;
        std::memcpy(&header, bytes->data() + 8, 4);
        if (header > bytes->size()) bytes = store.tier->peek(key, header);
    }
    if (!bytes.ok()) {
        if (fault != nullptr) *fault = bytes.status().message();
        return bytes.status();
    }
    return parse_any_block_header(*bytes, fault);
}

std::vector<BlockHead> StoreView::blocks() const {
    std::vector<BlockHead> out;
    for (const auto& store : stores_) {
        for (const auto& e : store->tier->blocks()) {
            BlockHead h;
            h.store = store.get();
            h.entry = e;
            if (auto m = read_header(*store, e.key, &h.fault); m.ok()) h.meta = std::move(*m);
            out.push_back(std::move(h));
        }
    }
    return out;
}

}  // namespace deltaserve::ops
