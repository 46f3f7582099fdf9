#include "deltaserve/model/kv_blocks.h"

#include <limits>
#include <string>

#include "deltaserve/common/chain_hash.h"
#include "deltaserve/kvstore/kv_block.h"

namespace deltaserve::model {

Result<ExportedKvBlocks> export_kv_blocks(const InferenceContext& ctx,
                                          std::span<const int32_t> tokens,
                                          const KvBlocksOptions& options) {
    const int32_t n = ctx.n_past();
    if (static_cast<int32_t>(tokens.size()) != n) {
        return invalid_argument("KV blocks: " + std::to_string(tokens.size()) +
                                " token ids for a context of " + std::to_string(n));
    }
    if (options.block_tokens < 1) return invalid_argument("KV blocks: block_tokens below 1");
    const int32_t n_layers = ctx.model().config.n_layers;
    ExportedKvBlocks out;
    uint64_t parent = options.root;
    for (int32_t begin = 0; begin < n; begin += options.block_tokens) {
        const int32_t end = std::min(n, begin + options.block_tokens);
        if (begin / options.block_tokens < options.first_block) {  // held already: chained only
            parent = hash_tokens(parent, tokens.subspan(static_cast<size_t>(begin),
                                                        static_cast<size_t>(end - begin)));
            continue;
        }
        kvstore::KvBlockMeta meta;
        meta.codec = options.codec;
        meta.fingerprint = options.fingerprint;
        meta.parent = parent;
        meta.begin = begin;
        meta.end = end;
        meta.tokens.assign(tokens.begin() + begin, tokens.begin() + end);
        DS_ASSIGN_OR_RETURN(meta.codec_state, ctx.export_kv_rows_state(end));
        meta.layer_error = ctx.kv_rows_error(begin, end);
        if (meta.layer_error.size() != static_cast<size_t>(n_layers))  // kept exact: none
            meta.layer_error.assign(static_cast<size_t>(n_layers),
                                    std::numeric_limits<float>::quiet_NaN());
        std::vector<std::vector<uint8_t>> parts;
        for (int32_t l = 0; l < n_layers; ++l) {
            DS_ASSIGN_OR_RETURN(std::vector<uint8_t> part, ctx.export_kv_rows(l, begin, end));
            parts.push_back(std::move(part));
        }
        const std::vector<std::span<const uint8_t>> views(parts.begin(), parts.end());
        DS_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, kvstore::encode_kv_block(meta, views));
        parent = hash_tokens(parent, meta.tokens);  // the block's key
        out.blocks.push_back(std::move(bytes));
    }
    out.hints = ctx.export_kv_hints();
    return out;
}

Status import_kv_blocks(InferenceContext& ctx, std::span<const std::span<const uint8_t>> blocks,
                        std::span<const uint8_t> hints, const KvBlocksOptions& options,
                        int32_t* bad_block) {
    if (bad_block != nullptr) *bad_block = -1;
    if (ctx.n_past() != 0) return failed_precondition("KV blocks: the context is not empty");
    if (blocks.empty()) return invalid_argument("KV blocks: none to import");
    const int32_t n_layers = ctx.model().config.n_layers;
    // Every block checked, and the chain whole, before anything is taken.
    std::vector<kvstore::KvBlockView> views;
    uint64_t parent = options.root;
    int32_t next = 0;
    for (size_t i = 0; i < blocks.size(); ++i) {
        const auto refuse = [&](Status s) {
            if (bad_block != nullptr) *bad_block = static_cast<int32_t>(i);
            return Status(s.code(), "KV block " + std::to_string(i) + ": " + s.message());
        };
        auto v = kvstore::parse_kv_block(blocks[i], options.fingerprint);
        if (!v.ok()) return refuse(v.status());
        const kvstore::KvBlockMeta& m = v->meta;
        if (m.codec != options.codec || m.n_layers() != n_layers) {
            return refuse(failed_precondition("another codec or layer count"));
        }
        if (m.parent != parent || m.begin != next) {
            return refuse(data_loss("does not follow the block before it"));
        }
        parent = m.key;
        next = m.end;
        views.push_back(std::move(*v));
    }
    if (next > ctx.n_ctx()) {
        return out_of_range("KV blocks: " + std::to_string(next) + " tokens, the context holds " +
                            std::to_string(ctx.n_ctx()));
    }
    const auto undo = [&](Status s, int32_t block) {
        ctx.reset();
        if (bad_block != nullptr) *bad_block = block;
        return s;
    };
    // The last block's state covers every token.
    Status s = ctx.import_kv_state(views.back().meta.codec_state);
    if (!s.ok()) return undo(s, static_cast<int32_t>(views.size()) - 1);
    for (size_t i = 0; i < views.size(); ++i) {
        const kvstore::KvBlockMeta& m = views[i].meta;
        for (int32_t l = 0; l < n_layers; ++l) {
            s = ctx.import_kv_rows(l, m.begin, m.end, views[i].parts[static_cast<size_t>(l)]);
            if (!s.ok()) return undo(s, static_cast<int32_t>(i));
        }
    }
    if (!hints.empty()) {
        s = ctx.import_kv_hints(hints);
        if (!s.ok()) return undo(s, -1);
    }
    return Status();
}

}  // namespace deltaserve::model
