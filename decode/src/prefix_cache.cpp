#include "prefix_cache.h"

#include <algorithm>
#include <string>

namespace deltaserve::decode {

namespace {

uint64_t mix(uint64_t h, uint64_t v) {
    // splitmix64's finalizer over the running hash and the next value.
    uint64_t x = h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t block_hash(uint64_t parent, std::span<const int32_t> tokens) {
    uint64_t h = mix(parent, tokens.size());
    for (int32_t t : tokens) h = mix(h, static_cast<uint32_t>(t));
    return h;
}

}  // namespace

uint64_t prefix_cache_root(std::span<const std::string> fingerprint) {
    uint64_t h = 0x64656c7461737276ull;  // "deltasrv"
    for (const std::string& s : fingerprint) {
        h = mix(h, s.size());
        for (unsigned char c : s) h = mix(h, c);
    }
    return h;
}

uint64_t PrefixCache::root_of(const std::string& scope) const {
    uint64_t h = mix(root_, scope.size());
    for (unsigned char c : scope) h = mix(h, c);
    return h;
}

std::vector<std::shared_ptr<PrefixCache::Block>> PrefixCache::chain_locked(
    uint64_t root, std::span<const int32_t> tokens, size_t max_blocks) const {
    std::vector<std::shared_ptr<Block>> chain;
    uint64_t parent = root;
    const size_t whole = std::min(max_blocks, tokens.size() / kBlockTokens);
    for (size_t i = 0; i < whole; ++i) {
        const auto part = tokens.subspan(i * kBlockTokens, kBlockTokens);
        auto it = blocks_.find(block_hash(parent, part));
        if (it == blocks_.end()) break;
        Block& b = *it->second;
        if (b.parent != parent ||
            !std::equal(part.begin(), part.end(), b.tokens.begin(), b.tokens.end())) {
            break;  // another prefix with the same hash: not ours
        }
        chain.push_back(it->second);
        parent = b.hash;
    }
    return chain;
}

void PrefixCache::touch_locked(const std::vector<std::shared_ptr<Block>>& chain) {
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
    const uint64_t root = root_of(scope);
    std::vector<std::shared_ptr<Block>> chain;
    {
        std::lock_guard<std::mutex> lock(mu_);
        chain = chain_locked(root, tokens.first(tokens.size() - 1), tokens.size());
        touch_locked(chain);
    }
    if (chain.empty()) return 0;
    // The copies run without the lock: the chain's references keep its blocks.
    const int32_t n = static_cast<int32_t>(chain.size()) * kBlockTokens;
    auto state = ctx.export_kv_rows_state(n);
    Status st = state.ok() ? ctx.import_kv_state(*state) : state.status();
    const int32_t n_layers = ctx.model().config.n_layers;
    for (int32_t l = 0; st.ok() && l < n_layers; ++l) {
        for (const auto& b : chain) {
            const int32_t begin = b->depth * kBlockTokens;
            st = ctx.import_kv_rows(l, begin, begin + kBlockTokens, b->layers[l]);
            if (!st.ok()) break;
        }
    }
    if (!st.ok()) {
        ctx.reset();
        return st;
    }
    std::lock_guard<std::mutex> lock(mu_);
    hit_tokens_ += n;
    return n;
}

Status PrefixCache::store(std::span<const int32_t> tokens, const std::string& scope,
                          const model::InferenceContext& ctx) {
    const size_t whole = std::min(tokens.size(), static_cast<size_t>(ctx.n_past())) / kBlockTokens;
    if (whole == 0 || max_bytes_ == 0) return {};
    const uint64_t root = root_of(scope);
    std::vector<uint64_t> hashes(whole);
    uint64_t parent = root;
    for (size_t i = 0; i < whole; ++i) {
        parent = block_hash(parent, tokens.subspan(i * kBlockTokens, kBlockTokens));
        hashes[i] = parent;
    }
    size_t first_new = 0;
    {
        std::lock_guard<std::mutex> lock(mu_);
        first_new = chain_locked(root, tokens, whole).size();
    }
    if (first_new == whole) return {};
    // Exported without the lock (the context is the caller's); the blocks are made whole
    // before any is added.
    const int32_t n_layers = ctx.model().config.n_layers;
    std::vector<std::shared_ptr<Block>> made;
    for (size_t i = first_new; i < whole; ++i) {
        auto b = std::make_shared<Block>();
        b->hash = hashes[i];
        b->parent = i == 0 ? root : hashes[i - 1];
        b->depth = static_cast<int32_t>(i);
        const auto part = tokens.subspan(i * kBlockTokens, kBlockTokens);
        b->tokens.assign(part.begin(), part.end());
        const int32_t begin = static_cast<int32_t>(i) * kBlockTokens;
        for (int32_t l = 0; l < n_layers; ++l) {
            DS_ASSIGN_OR_RETURN(auto rows, ctx.export_kv_rows(l, begin, begin + kBlockTokens));
            b->bytes += rows.size();
            b->layers.push_back(std::move(rows));
        }
        made.push_back(std::move(b));
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& b : made) {
        // The parent may have gone meanwhile (evicted), or another turn added the block.
        if (b->depth > 0 && blocks_.count(b->parent) == 0) break;
        if (auto it = blocks_.find(b->hash); it != blocks_.end()) {
            // The same block, or another prefix with the same hash: then neither it nor what
            // follows it is added, so that every block's parent is its own prefix.
            if (it->second->parent != b->parent || it->second->tokens != b->tokens) break;
            continue;
        }
        if (b->depth > 0) blocks_[b->parent]->children.push_back(b->hash);
        lru_.push_front(b->hash);
        b->lru = lru_.begin();
        bytes_ += b->bytes;
        blocks_.emplace(b->hash, b);
    }
    // The new chain is the most recently used, its deepest block first.
    touch_locked(chain_locked(root, tokens, whole));
    evict_locked();
    return {};
}

void PrefixCache::erase_leaf_locked(uint64_t hash) {
    auto it = blocks_.find(hash);
    std::shared_ptr<Block> b = it->second;
    blocks_.erase(it);
    lru_.erase(b->lru);
    bytes_ -= b->bytes;
    if (b->depth > 0) {
        auto p = blocks_.find(b->parent);
        if (p != blocks_.end()) std::erase(p->second->children, hash);
    }
}

void PrefixCache::evict_locked() {
    // From the least recently used end, leaves only (a prompt reaches a block through its
    // parents); blocks a load is copying (referenced beyond the map) stay.
    auto it = lru_.end();
    while (bytes_ > max_bytes_ && it != lru_.begin()) {
        --it;
        auto b = blocks_.find(*it);
        if (b->second.use_count() > 1 || !b->second->children.empty()) continue;
        const uint64_t hash = *it;
        it = std::next(it);  // erase invalidates *it only
        erase_leaf_locked(hash);
    }
}

PrefixCache::Stats PrefixCache::stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return Stats{static_cast<int64_t>(blocks_.size()), static_cast<int64_t>(bytes_), hit_tokens_};
}

}  // namespace deltaserve::decode
