#include "prefix_cache.h"

#include <algorithm>
#include <string>

#include "deltaserve/common/chain_hash.h"

namespace deltaserve::decode {

uint64_t prefix_cache_root(std::span<const std::string> fingerprint) {
    return hash_root(fingerprint);
}

uint64_t PrefixCache::root_of(const std::string& scope) const { return hash_string(root_, scope); }

PrefixCache::PrefixCache(uint64_t root, size_t max_bytes, std::shared_ptr<kvstore::BlockPool> pool,
                         kvstore::KvLayerGroups groups)
    : root_(root),
      max_bytes_(max_bytes),
      pool_(std::move(pool)),
      groups_(groups.group_layers > 0 ? std::move(groups)
                                      : kvstore::KvLayerGroups::whole(pool_->options().n_layers)) {}

namespace {
void release_ids(kvstore::BlockPool& pool, const std::vector<int32_t>& ids) {
    for (int32_t id : ids) {
        if (id >= 0) pool.release(std::span<const int32_t>(&id, 1));
    }
}
}  // namespace

PrefixCache::~PrefixCache() {
    for (const auto& [hash, b] : blocks_) release_ids(*pool_, b.ids);
}

size_t PrefixCache::usable(const std::vector<const Block*>& chain) const {
    if (!groups_.has_window()) return chain.size();
    for (size_t c = chain.size(); c > 0; --c) {
        const int64_t end = static_cast<int64_t>(c) * kBlockTokens;
        const size_t need =
            static_cast<size_t>(std::max<int64_t>(0, end - groups_.window + 1) / kBlockTokens);
        bool whole = true;
        for (size_t b = need; b < c && whole; ++b) {
            for (int32_t g = 0; g < groups_.n_groups(); ++g) {
                if (chain[b]->ids[static_cast<size_t>(g)] < 0) whole = false;
            }
        }
        if (whole) return c;
    }
    return 0;
}

std::vector<const PrefixCache::Block*> PrefixCache::chain_locked(uint64_t root,
                                                                 std::span<const int32_t> tokens,
                                                                 size_t max_blocks) const {
    std::vector<const Block*> chain;
    uint64_t parent = root;
    const size_t whole = std::min(max_blocks, tokens.size() / kBlockTokens);
    for (size_t i = 0; i < whole; ++i) {
        const auto part = tokens.subspan(i * kBlockTokens, kBlockTokens);
        auto it = blocks_.find(hash_tokens(parent, part));
        if (it == blocks_.end()) break;
        const Block& b = it->second;
        if (b.parent != parent ||
            !std::equal(part.begin(), part.end(), b.tokens.begin(), b.tokens.end())) {
            break;  // another prefix with the same hash: not ours
        }
        chain.push_back(&b);
        parent = b.hash;
    }
    return chain;
}

void PrefixCache::touch_locked(const std::vector<const Block*>& chain) {
    // Most recently used, the deepest nearest the old end: of blocks used together, the
    // leaves go first.
    for (auto b = chain.rbegin(); b != chain.rend(); ++b) {
        lru_.splice(lru_.begin(), lru_, (*b)->lru);
    }
}

int32_t PrefixCache::held(std::span<const int32_t> tokens, const std::string& scope) const {
    if (tokens.size() < 2) return 0;
    const uint64_t root = root_of(scope);
    std::lock_guard<std::mutex> lock(mu_);
    // As load() matches: leaving the last token.
    return static_cast<int32_t>(
               usable(chain_locked(root, tokens.first(tokens.size() - 1), tokens.size()))) *
           kBlockTokens;
}

Result<int32_t> PrefixCache::load(std::span<const int32_t> tokens, const std::string& scope,
                                  model::InferenceContext& ctx) {
    if (tokens.size() < 2) return 0;
    if (ctx.kv_block_pool() != pool_.get())
        return failed_precondition("the context's KV is not in the prefix cache's block pool");
    const uint64_t root = root_of(scope);
    std::lock_guard<std::mutex> lock(mu_);
    auto chain = chain_locked(root, tokens.first(tokens.size() - 1), tokens.size());
    chain.resize(usable(chain));
    if (chain.empty()) return 0;
    touch_locked(chain);
    // Adopted under the lock: the cache's references keep the blocks until ctx holds its own.
    std::vector<int32_t> ids;
    for (const Block* b : chain) ids.insert(ids.end(), b->ids.begin(), b->ids.end());
    DS_RETURN_IF_ERROR(ctx.adopt_kv_blocks(ids));
    const int32_t n = static_cast<int32_t>(chain.size()) * kBlockTokens;
    hit_tokens_ += n;
    return n;
}

void PrefixCache::store(std::span<const int32_t> tokens, const std::string& scope,
                        const model::InferenceContext& ctx) {
    const size_t whole = std::min(tokens.size(), static_cast<size_t>(ctx.n_past())) / kBlockTokens;
    if (whole == 0 || max_bytes_ == 0 || ctx.kv_block_pool() != pool_.get()) return;
    const uint64_t root = root_of(scope);
    const std::vector<int32_t> ids = ctx.kv_blocks(static_cast<int32_t>(whole));
    const auto n_groups = static_cast<size_t>(groups_.n_groups());
    if (ids.size() != whole * n_groups) return;  // another layout: not this cache's contexts
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t parent = root;
    std::vector<const Block*> chain;
    for (size_t i = 0; i < whole; ++i) {
        const auto part = tokens.subspan(i * kBlockTokens, kBlockTokens);
        const uint64_t hash = hash_tokens(parent, part);
        if (auto it = blocks_.find(hash); it != blocks_.end()) {
            // The same block, or another prefix with the same hash: then neither it nor what
            // follows it is added, so that every block's parent is its own prefix.
            if (it->second.parent != parent ||
                !std::equal(part.begin(), part.end(), it->second.tokens.begin(),
                            it->second.tokens.end())) {
                break;
            }
            // A window group's block the entry no longer had, this context still has.
            for (size_t g = 0; g < n_groups; ++g) {
                int32_t& have = it->second.ids[g];
                const int32_t id = ids[i * n_groups + g];
                if (have >= 0 || id < 0) continue;
                have = id;
                pool_->retain(std::span<const int32_t>(&have, 1));
                ++n_ids_;
            }
        } else {
            Block& b = blocks_[hash];
            b.hash = hash;
            b.parent = parent;
            b.depth = static_cast<int32_t>(i);
            b.tokens.assign(part.begin(), part.end());
            b.ids.assign(ids.begin() + static_cast<std::ptrdiff_t>(i * n_groups),
                         ids.begin() + static_cast<std::ptrdiff_t>((i + 1) * n_groups));
            for (int32_t id : b.ids) {
                if (id < 0) continue;
                pool_->retain(std::span<const int32_t>(&id, 1));
                ++n_ids_;
            }
            if (i > 0) blocks_.at(parent).children.push_back(hash);
            lru_.push_front(hash);
            b.lru = lru_.begin();
        }
        chain.push_back(&blocks_.at(hash));
        parent = hash;
    }
    // The new chain is the most recently used, its deepest block first.
    touch_locked(chain);
    const size_t block_bytes = pool_->block_bytes();
    evict_locked([&] { return static_cast<size_t>(n_ids_) * block_bytes > max_bytes_; }, false);
}

int32_t PrefixCache::reclaim(int32_t blocks) {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t before = n_ids_;
    evict_locked([&] { return before - n_ids_ < blocks; }, true);
    return static_cast<int32_t>(before - n_ids_);
}

void PrefixCache::erase_leaf_locked(uint64_t hash) {
    auto it = blocks_.find(hash);
    const Block& b = it->second;
    lru_.erase(b.lru);
    release_ids(*pool_, b.ids);
    n_ids_ -= std::count_if(b.ids.begin(), b.ids.end(), [](int32_t id) { return id >= 0; });
    if (b.depth > 0) {
        auto p = blocks_.find(b.parent);
        if (p != blocks_.end()) std::erase(p->second.children, hash);
    }
    blocks_.erase(it);
}

template <class More>
int32_t PrefixCache::evict_locked(More&& more, bool only_ours) {
    // From the least recently used end, leaves only (a prompt reaches a block through its
    // parents; a leaf's parent is more recent, so one pass can take both).
    int32_t evicted = 0;
    auto it = lru_.end();
    while (it != lru_.begin()) {
        --it;
        const Block& b = blocks_.at(*it);
        const bool shared = std::any_of(b.ids.begin(), b.ids.end(),
                                        [&](int32_t id) { return id >= 0 && pool_->refs(id) > 1; });
        if (!b.children.empty() || (only_ours && shared)) continue;
        if (!more()) break;
        const uint64_t hash = *it;
        it = std::next(it);  // erase invalidates *it only
        erase_leaf_locked(hash);
        ++evicted;
    }
    return evicted;
}

PrefixCache::Stats PrefixCache::stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return Stats{n_ids_, n_ids_ * static_cast<int64_t>(pool_->block_bytes()), hit_tokens_};
}

}  // namespace deltaserve::decode
