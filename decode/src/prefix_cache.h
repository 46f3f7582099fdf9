// Automatic prefix caching (vLLM's, SGLang's radix cache): the KV of earlier prompts and
// answers, kept in blocks of kBlockTokens tokens and found by any later prompt that starts
// with the same tokens, whether it names a session or not. A stateless multi-turn chat
// prefills only its new messages; a system prompt that many requests share is computed once.
//
// A block is keyed by a chained hash: of its parent's hash (for the first block, the root: the
// model, profile and KV codec of the worker) and its token ids, so equal hashes mean equal
// prefixes, and each block keeps its tokens, checked on every match (a collision is a miss,
// never another prompt's KV). A block is a block of the worker's kvstore::BlockPool, the very
// one the turn that computed it holds: the cache keeps a reference to it, a later prompt's
// context adopts it (one more reference, no copy), and however many sessions share a system
// prompt, its blocks are in memory once. Eviction takes the least recently used first,
// deepest first: beyond max_bytes any such block leaves the index (its holders keep it), and
// when the pool runs short (reclaim) those only the cache holds are given back.
//
// Only caches whose state at a prefix is the state of that prefix computed alone can be
// matched this way (full KV: every token's row is final once stored); the decode worker asks
// for one only then. Thread-safe.
//
// A model with sliding-window layers keeps a block per layer group (kvstore::KvLayerGroups):
// an entry holds each group's block of its 16 positions, a window group's only while some
// context still had it when the entry was stored (or filled in by a later store). A prefix
// matches up to the last block whose window groups' blocks the window ending there needs are
// all held (vLLM's rule for sliding-window layers).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "deltaserve/common/status.h"
#include "deltaserve/kvstore/block_pool.h"
#include "deltaserve/kvstore/kv_layer_groups.h"
#include "deltaserve/model/inference_context.h"

namespace deltaserve::decode {

class PrefixCache {
  public:
    static constexpr int32_t kBlockTokens = kvstore::BlockPool::kBlockTokens;

    // root: what the KV depends on besides the tokens (model, profile, codec); max_bytes:
    // the blocks' bytes at most; pool: the blocks' pool, the contexts' (ContextOptions::
    // kv_blocks).
    // groups: how the contexts' layers share the pool's blocks (default: one group).
    PrefixCache(uint64_t root, size_t max_bytes, std::shared_ptr<kvstore::BlockPool> pool,
                kvstore::KvLayerGroups groups = {});
    ~PrefixCache();
    PrefixCache(const PrefixCache&) = delete;
    PrefixCache& operator=(const PrefixCache&) = delete;

    // Each call names a scope (decode::TurnSpec::cache_scope): blocks stored in one are found
    // only in it.
    //
    // Into ctx (empty, on the cache's pool): the blocks of the longest run of whole blocks
    // that starts `tokens` and leaves at least one token after it (the turn needs the last
    // token's logits). Returns how many tokens it holds now (0: none cached). Errors (ctx is
    // left empty): what the context's adopt said.
    Result<int32_t> load(std::span<const int32_t> tokens, const std::string& scope,
                         model::InferenceContext& ctx);

    // How many tokens load() would give now (a multiple of kBlockTokens): whether a context
    // for it is worth making.
    int32_t held(std::span<const int32_t> tokens, const std::string& scope) const;

    // Keeps the whole blocks of ctx's tokens (its first tokens.size() positions) that are not
    // cached yet, evicting the least recently used beyond max_bytes.
    void store(std::span<const int32_t> tokens, const std::string& scope,
               const model::InferenceContext& ctx);

    // Gives back up to `blocks` pool blocks that only the cache holds, least recently used
    // first (the pool's reclaimer). Returns how many.
    int32_t reclaim(int32_t blocks);

    struct Stats {
        int64_t blocks = 0;
        int64_t bytes = 0;
        int64_t hit_tokens = 0;  // prompt tokens loaded from the cache, in all
    };
    Stats stats() const;

  private:
    struct Block {
        uint64_t hash = 0, parent = 0;
        int32_t depth = 0;  // its first token is at depth * kBlockTokens
        std::vector<int32_t> tokens;
        // In pool_, one per layer group (-1: a window group's not held); one reference each is
        // the cache's.
        std::vector<int32_t> ids;
        std::vector<uint64_t> children;
        std::list<uint64_t>::iterator lru;  // in lru_, most recent at the front
    };

    // The chain of blocks cached for `tokens`' leading whole blocks (at most max_blocks),
    // each checked against its parent and its tokens. Under mu_.
    std::vector<const Block*> chain_locked(uint64_t root, std::span<const int32_t> tokens,
                                           size_t max_blocks) const;
    uint64_t root_of(const std::string& scope) const;
    // How many blocks of a chain load() may take: the window groups' blocks that the window
    // ending at the last one reaches are held.
    size_t usable(const std::vector<const Block*>& chain) const;
    // Makes a chain the most recently used.
    void touch_locked(const std::vector<const Block*>& chain);
    // Drops a block no other block follows, and the cache's reference to its pool block.
    void erase_leaf_locked(uint64_t hash);
    // Drops least recently used leaves while `more` says so; only_ours: those only the cache
    // holds. Returns how many.
    template <class More>
    int32_t evict_locked(More&& more, bool only_ours);

    const uint64_t root_;
    const size_t max_bytes_;
    const std::shared_ptr<kvstore::BlockPool> pool_;
    const kvstore::KvLayerGroups groups_;
    mutable std::mutex mu_;
    int64_t n_ids_ = 0;  // pool blocks the entries hold
    std::unordered_map<uint64_t, Block> blocks_;
    std::list<uint64_t> lru_;
    int64_t hit_tokens_ = 0;
};

// The root of a worker's chained hashes: what its KV depends on besides the tokens.
uint64_t prefix_cache_root(std::span<const std::string> fingerprint);

}  // namespace deltaserve::decode
