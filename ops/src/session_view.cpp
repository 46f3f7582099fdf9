#include "session_view.h"

#include "deltaserve/common/crc32c.h"
#include "deltaserve/kvstore/kv_rows_info.h"
#include "table.h"

namespace deltaserve::ops {

BlockReader store_reader(const StoreView& view, const Store& store) {
    return [&view, &store](uint64_t key) { return view.read_block(store, key); };
}

Described describe_blocks(const StoredSession& s, const BlockReader& read) {
    Described d;
    uint64_t good_bytes = 0, full_token_bytes = 0;
    int32_t prev_end = 0;
    for (size_t i = 0; i < s.record.keys.size(); ++i) {
        BlockRow b;
        b.key = s.record.keys[i];
        b.begin = prev_end;
        b.end = prev_end = s.record.ends[i];
        auto bytes = read(b.key);
        if (!bytes.ok()) {
            b.check = bytes.status().code() == StatusCode::kNotFound ? "missing" : "unreadable";
            d.blocks.push_back(b);
            continue;
        }
        b.held = true;
        b.bytes = bytes->size();
        if (s.store != nullptr) b.tiers = {"disk"};
        std::string fault;
        auto v = parse_any_block(*bytes, &fault);
        if (!v.ok()) {
            b.check = fault;
            d.blocks.push_back(b);
            continue;
        }
        const kvstore::KvBlockMeta& m = v->meta;
        if (m.key != b.key || m.begin != b.begin || m.end != b.end) {
            b.check = "another block";
        } else if (s.record.crcs[i] != 0 && s.record.crcs[i] != crc32c(*bytes)) {
            b.check = "another export";
        } else {
            b.check = "ok";
        }
        d.policy = codec_name(m.codec);
        if (d.layers.size() < static_cast<size_t>(m.n_layers())) d.layers.resize(m.n_layers());
        double err_sum = 0.0;
        int err_n = 0;
        const int32_t n = m.end - m.begin;
        for (int32_t l = 0; l < m.n_layers(); ++l) {
            auto info = kvstore::kv_rows_info(m.codec, m.codec_state, l, m.begin, m.end,
                                              v->parts[static_cast<size_t>(l)]);
            if (!info.ok()) {
                b.check = "layer " + std::to_string(l) + " does not parse";
                break;
            }
            LayerSum& L = d.layers[static_cast<size_t>(l)];
            L.full = info->full;
            L.window = info->window;
            L.sinks += info->sinks;
            L.references += info->references;
            L.latents += info->latents;
            L.buffer += info->buffer;
            L.exact_bytes += info->exact_bytes;
            L.latent_bytes += info->latent_bytes;
            const float e = m.layer_error[static_cast<size_t>(l)];
            if (!std::isnan(e) && info->latents > 0) {
                L.err_sq += static_cast<double>(e) * e * info->latents;
                L.err_latents += info->latents;
            }
            if (!std::isnan(e)) {
                err_sum += e;
                ++err_n;
            }
            if (info->full && !info->window && full_token_bytes == 0 && n > 0) {
                // A full layer's rows: K and V of every token; full KV's bytes per token.
                full_token_bytes = info->exact_bytes / static_cast<uint64_t>(n) *
                                   static_cast<uint64_t>(m.n_layers());
            }
        }
        if (err_n > 0) b.error = err_sum / err_n;
        if (b.check == "ok") {
            good_bytes += b.bytes;
            d.tokens_readable += n;
        }
        d.blocks.push_back(b);
    }
    if (full_token_bytes > 0 && d.tokens_readable > 0)
        d.keep = static_cast<double>(good_bytes) /
                 (static_cast<double>(full_token_bytes) * static_cast<double>(d.tokens_readable));
    return d;
}

std::string layer_role(const Described& d, size_t layer) {
    if (d.layers[layer].window) return "window";
    if (!d.layers[layer].full) return "sparse";
    for (size_t l = layer + 1; l < d.layers.size(); ++l) {
        if (d.layers[l].window) continue;
        if (!d.layers[l].full) return "observation";
    }
    return "full";
}

Result<std::vector<TokenRow>> token_kinds(const StoredSession& s, const BlockReader& read,
                                          int32_t begin, int32_t end) {
    const int32_t n = static_cast<int32_t>(s.record.tokens.size());
    if (begin < 0 || end > n || begin >= end)
        return out_of_range("tokens " + std::to_string(begin) + ":" + std::to_string(end) +
                            " are not in the session's " + std::to_string(n));
    std::vector<TokenRow> out;
    int32_t block_begin = 0;
    for (size_t i = 0; i < s.record.keys.size(); ++i) {
        const int32_t block_end = s.record.ends[i];
        if (block_end > begin && block_begin < end) {
            DS_ASSIGN_OR_RETURN(auto bytes, read(s.record.keys[i]));
            DS_ASSIGN_OR_RETURN(auto v, parse_any_block(bytes));
            const kvstore::KvBlockMeta& m = v.meta;
            // The first sparse layer (one whose error was measured, or any when none).
            int32_t layer = 0;
            for (int32_t l = 0; l < m.n_layers(); ++l) {
                if (!std::isnan(m.layer_error[static_cast<size_t>(l)])) {
                    layer = l;
                    break;
                }
            }
            DS_ASSIGN_OR_RETURN(auto info,
                                kvstore::kv_rows_info(m.codec, m.codec_state, layer, m.begin, m.end,
                                                      v.parts[static_cast<size_t>(layer)], true));
            for (int32_t p = std::max(begin, m.begin); p < std::min(end, m.end); ++p) {
                static constexpr const char* kNames[] = {"exact",  "sink",   "reference",
                                                         "latent", "buffer", "dropped"};
                out.push_back(
                    {p, m.tokens[static_cast<size_t>(p - m.begin)],
                     kNames[static_cast<int>(info.kinds[static_cast<size_t>(p - m.begin)])]});
            }
        }
        block_begin = block_end;
    }
    return out;
}

json session_json(const StoredSession& s) {
    return {{"key", s.key},
            {"tenant", s.tenant},
            {"id", s.id},
            {"node", s.has_gateway_record ? json(s.node) : json()},
            {"turns", or_null(int64_t{s.turns})},
            {"messages", or_null(int64_t{s.messages})},
            {"tokens", or_null(s.tokens)},
            {"stored_tokens", s.has_kv_record ? json(s.record.tokens.size()) : json()},
            {"blocks", s.has_kv_record ? json(s.record.keys.size()) : json()},
            {"blocks_held", s.has_kv_record ? json(s.blocks_held) : json()},
            {"disk_bytes", s.has_kv_record ? json(s.disk_bytes) : json()},
            {"host_bytes", json()},
            {"decode_bytes", json()},
            {"last_used", s.last_used > 0 ? json(s.last_used) : json()},
            {"ttl_left_seconds", json()},
            {"pinned", json()},
            {"store", s.store != nullptr ? json(s.store->dir) : json()},
            {"fingerprint", s.has_kv_record ? json(hex64(s.fingerprint)) : json()}};
}

}  // namespace deltaserve::ops
