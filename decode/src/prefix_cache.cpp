#include "prefix_cache.h"

#include <algorithm>
#include <string>

#include "deltaserve/common/chain_hash.h"

namespace deltaserve::decode {

uint64_t prefix_cache_root(std::span<const std::string> fingerprint) {
    return hash_root(fingerprint);
}

uint64_t PrefixCache::root_of(const std::string& scope) const { return hash_string(root_, scope); }

PrefixCache::~PrefixCache() {
    for (const auto& [hash, b] : blocks_) pool_->release(std::span<const int32_t>(&b.block, 1));
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
               chain_locked(root, tokens.first(tokens.size() - 1), tokens.size()).size()) *
           kBlockTokens;
}

Result<int32_t> PrefixCache::load(std::span<const int32_t> tokens, const std::string& scope,
                                  model::InferenceContext& ctx) {
    if (tokens.size() < 2) return 0;
    if (ctx.kv_block_pool() != pool_.get())
        return failed_precondition("the context's KV is not in the prefix cache's block pool");
    const uint64_t root = root_of(scope);
    std::lock_guard<std::mutex> lock(mu_);
    const auto chain = chain_locked(root, tokens.first(tokens.size() - 1), tokens.size());
    if (chain.empty()) return 0;
    touch_locked(chain);
    // Adopted under the lock: the cache's references keep the blocks until ctx holds its own.
    std::vector<int32_t> ids;
    for (const Block* b : chain) ids.push_back(b->block);
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
        } else {
            Block& b = blocks_[hash];
            b.hash = hash;
            b.parent = parent;
            b.depth = static_cast<int32_t>(i);
            b.tokens.assign(part.begin(), part.end());
            b.block = ids[i];
            pool_->retain(std::span<const int32_t>(&b.block, 1));
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
    evict_locked([&] { return blocks_.size() * block_bytes > max_bytes_; }, false);
}

int32_t PrefixCache::reclaim(int32_t blocks) {
    std::lock_guard<std::mutex> lock(mu_);
    int32_t taken = 0;
    return evict_locked([&] { return taken++ < blocks; }, true);
}

void PrefixCache::erase_leaf_locked(uint64_t hash) {
    auto it = blocks_.find(hash);
    const Block& b = it->second;
    lru_.erase(b.lru);
    pool_->release(std::span<const int32_t>(&b.block, 1));
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
        if (!b.children.empty() || (only_ours && pool_->refs(b.block) > 1)) continue;
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
    return Stats{static_cast<int64_t>(blocks_.size()),
                 static_cast<int64_t>(blocks_.size() * pool_->block_bytes()), hit_tokens_};
}

}  // namespace deltaserve::decode
