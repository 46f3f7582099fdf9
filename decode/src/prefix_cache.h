// Automatic prefix caching (vLLM's, SGLang's radix cache): the KV of earlier prompts and
// answers, kept in blocks of kBlockTokens tokens and found by any later prompt that starts
// with the same tokens, whether it names a session or not. A stateless multi-turn chat
// prefills only its new messages; a system prompt that many requests share is computed once.
//
// A block is keyed by a chained hash: of its parent's hash (for the first block, the root: the
// model, profile and KV codec of the worker) and its token ids, so equal hashes mean equal
// prefixes, and each block keeps its tokens, checked on every match (a collision is a miss,
// never another prompt's KV). Blocks are copies (a context's rows, as
// kvstore::SequenceCache::export_rows gives them), stored once however many prompts share
// them; a match holds references to its blocks while it copies them into a new context, and
// eviction (least recently used first, deepest first) takes only blocks no copy holds.
//
// Only caches whose state at a prefix is the state of that prefix computed alone can be
// matched this way (full KV: every token's row is final once stored); the decode worker asks
// for one only then. Thread-safe.
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
#include "deltaserve/model/inference_context.h"

namespace deltaserve::decode {

class PrefixCache {
  public:
    static constexpr int32_t kBlockTokens = 16;

    // root: what the KV depends on besides the tokens (model, profile, codec); max_bytes:
    // the blocks' bytes at most.
    PrefixCache(uint64_t root, size_t max_bytes) : root_(root), max_bytes_(max_bytes) {}
    PrefixCache(const PrefixCache&) = delete;
    PrefixCache& operator=(const PrefixCache&) = delete;

    // Each call names a scope (decode::TurnSpec::cache_scope): blocks stored in one are found
    // only in it.
    //
    // Into ctx (empty, made like the contexts the blocks came from): the KV of the longest
    // run of whole blocks that starts `tokens` and leaves at least one token after it (the
    // turn needs the last token's logits). Returns how many tokens it holds now (0: none
    // cached). Errors (ctx is left empty): what the context's import said.
    Result<int32_t> load(std::span<const int32_t> tokens, const std::string& scope,
                         model::InferenceContext& ctx);

    // How many tokens load() would give now (a multiple of kBlockTokens): whether a context
    // for it is worth making.
    int32_t held(std::span<const int32_t> tokens, const std::string& scope) const;

    // Caches the whole blocks of ctx's tokens (its first tokens.size() positions) that are
    // not cached yet, evicting the least recently used beyond max_bytes. Errors: what the
    // context's export said (nothing is added).
    Status store(std::span<const int32_t> tokens, const std::string& scope,
                 const model::InferenceContext& ctx);

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
        std::vector<std::vector<uint8_t>> layers;  // per layer: K rows then V rows
        size_t bytes = 0;
        std::vector<uint64_t> children;
        std::list<uint64_t>::iterator lru;  // in lru_, most recent at the front
    };

    // The chain of blocks cached for `tokens`' leading whole blocks (at most max_blocks),
    // each checked against its parent and its tokens. Under mu_.
    std::vector<std::shared_ptr<Block>> chain_locked(uint64_t root, std::span<const int32_t> tokens,
                                                     size_t max_blocks) const;
    uint64_t root_of(const std::string& scope) const;
    // Makes a chain the most recently used.
    void touch_locked(const std::vector<std::shared_ptr<Block>>& chain);
    // Drops a block no other block follows.
    void erase_leaf_locked(uint64_t hash);
    void evict_locked();

    const uint64_t root_;
    const size_t max_bytes_;
    mutable std::mutex mu_;
    std::unordered_map<uint64_t, std::shared_ptr<Block>> blocks_;
    std::list<uint64_t> lru_;
    size_t bytes_ = 0;
    int64_t hit_tokens_ = 0;
};

// The root of a worker's chained hashes: what its KV depends on besides the tokens.
uint64_t prefix_cache_root(std::span<const std::string> fingerprint);

}  // namespace deltaserve::decode
