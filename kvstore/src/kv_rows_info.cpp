// Reading a block's rows without a cache: the formats of FullSequenceCache's rows and
// DeltaKvCodec's (src/deltakv_codec.h), counted, not taken.
#include "deltaserve/kvstore/kv_rows_info.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <string>
#include <vector>

#include "byte_io.h"
#include "deltaserve/kernels/deltakv.h"
#include "deltaserve/kvstore/kv_block.h"

namespace deltaserve::kvstore {
namespace {

Status bad(const std::string& what) { return data_loss("KV rows: " + what); }

// Exact rows only: K then V, `row` bytes each (0: any size that divides evenly).
Result<KvRowsInfo> exact_rows(int32_t n, int32_t row, std::span<const uint8_t> part,
                              bool with_kinds) {
    KvRowsInfo info;
    info.buffer = n;
    if (with_kinds) info.kinds.assign(static_cast<size_t>(n), KvRowsInfo::Kind::kExact);
    info.exact_bytes = part.size();
    const uint64_t per_token = 2 * static_cast<uint64_t>(row);
    if (row > 0 ? part.size() != per_token * static_cast<uint64_t>(n)
                : (n == 0 ? !part.empty() : part.size() % (2 * static_cast<uint64_t>(n)) != 0)) {
        return bad(std::to_string(part.size()) + " bytes for " + std::to_string(n) +
                   " exact tokens");
    }
    return info;
}

// A window layer's part: the first position it holds, then exact rows from there.
Result<KvRowsInfo> window_rows(int32_t begin, int32_t end, int32_t row,
                               std::span<const uint8_t> part, bool with_kinds) {
    ByteReader p(part);
    int32_t first = 0;
    if (!p.i32(first) || first < begin || first > end)
        return bad("a window layer's part without its first position");
    DS_ASSIGN_OR_RETURN(KvRowsInfo info, exact_rows(end - first, row, part.subspan(4), with_kinds));
    info.exact_bytes = part.size();  // (with the position, as a sparse part's region end)
    info.window = true;
    info.dropped = first - begin;
    if (with_kinds)
        info.kinds.insert(info.kinds.begin(), static_cast<size_t>(first - begin),
                          KvRowsInfo::Kind::kDropped);
    return info;
}

}  // namespace

Result<KvRowsInfo> kv_rows_info(KvCodecId codec, std::span<const uint8_t> state, int32_t layer,
                                int32_t begin, int32_t end, std::span<const uint8_t> part,
                                bool with_kinds) {
    if (begin < 0 || end < begin) return bad("an invalid token range");
    const int32_t n = end - begin;
    ByteReader r(state);
    if (codec == KvCodecId::kRows) {
        // FullSequenceCache's: n_tokens, row bytes; with window layers, the window, the layer
        // count and a byte per layer (1: a window layer, whose part starts with the first
        // position it holds).
        int32_t n_tokens = 0, row = 0, window = 0, n_layers = 0;
        if (!r.i32(n_tokens) || !r.i32(row) || row <= 0 || end > n_tokens ||
            (r.remaining() > 0 &&
             (!r.i32(window) || !r.i32(n_layers) || window <= 0 || n_layers <= 0 ||
              r.remaining() != static_cast<size_t>(n_layers))))
            return bad("a full-KV rows state that does not parse");
        if (window > 0 && (layer < 0 || layer >= n_layers))
            return invalid_argument("KV rows: no layer " + std::to_string(layer));
        const std::span<const uint8_t> flags = r.take(static_cast<size_t>(n_layers));
        if (window == 0 || flags[static_cast<size_t>(layer)] == 0)
            return exact_rows(n, row, part, with_kinds);
        return window_rows(begin, end, row, part, with_kinds);
    }
    if (codec != KvCodecId::kDeltaKv) return invalid_argument("KV rows: a codec with no rows");
    // DeltaKvCodec::state_head with kRowsState: n_tokens, -1, sinks, k, latent bits, m,
    // sparse layers, then each layer's role (0 sparse, 1 full, 2 window) and, where a layer
    // is a window layer, the window and the layer count (int32s). Without window layers the
    // roles are all 0 or 1, so a byte of another value says the two follow them.
    int32_t v[7];
    for (int32_t& x : v) {
        if (!r.i32(x)) return bad("a DeltaKV rows state cut short");
    }
    const int32_t n_tokens = v[0], sinks = v[2], k = v[3], bits = v[4], m = v[5];
    const std::span<const uint8_t> tail = r.take(r.remaining());
    const bool windows = std::any_of(tail.begin(), tail.end(), [](uint8_t b) { return b > 1; });
    const size_t n_layers = windows && tail.size() >= 8 ? tail.size() - 8 : tail.size();
    const auto roles = tail.first(n_layers);
    int32_t window = 0, counted = static_cast<int32_t>(n_layers);
    if (windows && tail.size() >= 8) {
        std::memcpy(&window, tail.data() + n_layers, 4);
        std::memcpy(&counted, tail.data() + n_layers + 4, 4);
    }
    if (v[1] != -1 || n_tokens < end || sinks < 0 || k < 1 || k > 64 || (bits != 4 && bits != 16) ||
        m < 1 || m > 4096 || n_layers == 0 ||
        std::any_of(roles.begin(), roles.end(), [](uint8_t b) { return b > 2; }) ||
        windows != (std::find(roles.begin(), roles.end(), 2) != roles.end()) ||
        (windows && (window < 1 || counted != static_cast<int32_t>(n_layers)))) {
        return bad("a DeltaKV rows state that does not parse");
    }
    if (layer < 0 || static_cast<size_t>(layer) >= n_layers)
        return invalid_argument("KV rows: no layer " + std::to_string(layer));
    if (roles[static_cast<size_t>(layer)] == 1) return exact_rows(n, 0, part, with_kinds);
    if (roles[static_cast<size_t>(layer)] == 2) return window_rows(begin, end, 0, part, with_kinds);

    ByteReader p(part);
    int32_t region = 0;
    // (The region may end past the block: the state's count is the block's end.)
    if (!p.i32(region) || region < sinks || region > kKvBlockMaxTokens)
        return bad("a DeltaKV part with no valid region end");
    const int32_t rb = std::max(begin, sinks), re = std::min(end, region);
    const int32_t n_bits = std::max(0, re - rb);
    const auto bitmap = p.take(static_cast<size_t>((n_bits + 7) / 8));
    if (bitmap.size() != static_cast<size_t>((n_bits + 7) / 8))
        return bad("a DeltaKV part cut short");
    KvRowsInfo info;
    info.full = false;
    for (int32_t i = 0; i < n_bits; ++i) info.references += (bitmap[i / 8] >> (i % 8)) & 1;
    info.latents = n_bits - info.references;
    info.sinks = std::max(0, std::min(end, sinks) - begin);
    info.buffer = n - info.sinks - n_bits;
    const uint64_t lb = bits == 4 ? kernels::int4_bytes(m) : 2 * static_cast<uint64_t>(m);
    info.latent_bytes =
        static_cast<uint64_t>(info.latents) * (lb + 2 * static_cast<uint64_t>(k) + 1);
    const uint64_t rest = p.remaining();
    const uint64_t fp = static_cast<uint64_t>(n - info.latents);
    if (rest < info.latent_bytes ||
        (fp == 0 ? rest != info.latent_bytes : (rest - info.latent_bytes) % (2 * fp) != 0)) {
        return bad(std::to_string(part.size()) + " bytes, not what " + std::to_string(fp) +
                   " exact tokens and " + std::to_string(info.latents) + " latents take");
    }
    info.exact_bytes = part.size() - info.latent_bytes;
    if (with_kinds) {
        using K = KvRowsInfo::Kind;
        for (int32_t p = begin; p < end; ++p) {
            if (p < sinks) {
                info.kinds.push_back(K::kSink);
            } else if (p >= rb && p < re) {
                const bool ref = (bitmap[(p - rb) / 8] >> ((p - rb) % 8)) & 1;
                info.kinds.push_back(ref ? K::kReference : K::kLatent);
            } else {
                info.kinds.push_back(K::kBuffer);
            }
        }
    }
    return info;
}

}  // namespace deltaserve::kvstore
