// Chained 64-bit hashes: a run of tokens is keyed by its parent's key and its own ids, so a
// key names the whole prefix up to it, and a root that holds what the KV depends on besides
// the tokens (model, tokenizer, profile) keeps another model's blocks from ever matching.
// The prefix cache (decode/) and stored KV blocks (kvstore/kv_block.h) key by these. Not a
// cryptographic hash: holders compare the tokens too.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace deltaserve {

// splitmix64's finalizer over the running hash and the next value.
inline uint64_t hash_mix(uint64_t h, uint64_t v) {
    uint64_t x = h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// h extended by a string's length and bytes.
inline uint64_t hash_string(uint64_t h, std::string_view s) {
    h = hash_mix(h, s.size());
    for (unsigned char c : s) h = hash_mix(h, c);
    return h;
}

// The key of a run of tokens after the run keyed `parent`.
inline uint64_t hash_tokens(uint64_t parent, std::span<const int32_t> tokens) {
    uint64_t h = hash_mix(parent, tokens.size());
    for (int32_t t : tokens) h = hash_mix(h, static_cast<uint32_t>(t));
    return h;
}

// A root from the strings that identify what the KV depends on.
inline uint64_t hash_root(std::span<const std::string> parts) {
    uint64_t h = 0x64656c7461737276ull;  // "deltasrv"
    for (const std::string& s : parts) h = hash_string(h, s);
    return h;
}

}  // namespace deltaserve
