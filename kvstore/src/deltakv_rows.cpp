// Layer-wise shipping of a DeltaKV session while its prefill runs: a range of a layer's
// positions as the session will hold them after the forward call's commit (the blocks it
// compresses were compressed at the layer's observe; with exact_share, once the last
// judging layer compressed them), and taking such ranges back.
#include <algorithm>
#include <climits>

#include "byte_io.h"
#include "deltaserve/kvstore/deltakv_cache.h"

namespace deltaserve::kvstore {

int32_t DeltaKvSequenceCache::rows_final_end(int32_t layer, bool last) const {
    const int32_t stored = n_tokens_ + n_reserved_;
    if (layer < 0 || layer >= options_.n_layers || options_.full_layer[layer]) return stored;
    // Which of the plan's tokens stay exact is known once every judging layer compressed it.
    if (exact_pending()) return std::min(stored, comp_end_);
    return last ? stored : std::min(stored, region_end());
}

Result<std::vector<uint8_t>> DeltaKvSequenceCache::export_rows_state(int32_t n_tokens) const {
    if (n_tokens < 0) return invalid_argument("a negative token count");
    return state_head(n_tokens, kRowsState);
}

Result<std::vector<uint8_t>> DeltaKvSequenceCache::export_rows(int32_t layer, int32_t begin,
                                                               int32_t end) const {
    if (layer < 0 || layer >= options_.n_layers) return invalid_argument("no such layer");
    const int32_t stored = n_tokens_ + n_reserved_;
    if (begin < 0 || begin > end || end > stored) {
        return invalid_argument("rows [" + std::to_string(begin) + ", " + std::to_string(end) +
                                ") are not in the cache (" + std::to_string(stored) + ")");
    }
    const bool full = options_.full_layer[layer];
    const SlotPool& pool = full ? *full_pool_ : *sparse_pool_;
    const int32_t li = layer_index_[layer];
    const size_t row = pool.row_bytes();
    std::vector<uint8_t> out;
    ByteWriter w(out);
    if (full) {
        for (int32_t p = begin; p < end; ++p) w.bytes(pool.k_base(li) + full_slot_[p] * row, row);
        for (int32_t p = begin; p < end; ++p) w.bytes(pool.v_base(li) + full_slot_[p] * row, row);
        return out;
    }
    const int32_t region = region_end();
    if (exact_pending() && end > comp_end_) {
        return failed_precondition("DeltaKV layer " + std::to_string(layer) + ": rows past " +
                                   std::to_string(comp_end_) +
                                   " asked for before the judging layers compressed them (exact_share)");
    }
    const int32_t rb = std::max(begin, options_.sinks), re = std::min(end, region);
    w.i32(region);
    std::vector<uint8_t> bits(static_cast<size_t>((std::max(0, re - rb) + 7) / 8), 0);
    std::vector<int32_t> fp, latent;
    for (int32_t p = begin; p < end; ++p) {
        const bool in_region = p >= rb && p < re;
        if (in_region && ref_flag_[p])
            bits[(p - rb) / 8] |= static_cast<uint8_t>(1u << ((p - rb) % 8));
        (in_region && !ref_flag_[p] ? latent : fp).push_back(p);
    }
    w.bytes(bits.data(), bits.size());
    for (int32_t p : fp) w.bytes(pool.k_base(li) + sparse_slot_[p] * row, row);
    for (int32_t p : fp) w.bytes(pool.v_base(li) + sparse_slot_[p] * row, row);
    // A latent is in the region already, or made by this call's compression of the layer.
    const size_t lb = latent_bytes();
    const int32_t kk = options_.k;
    std::vector<const uint16_t*> refs;
    for (int32_t p : latent) {
        const uint8_t* z = nullptr;
        if (latent_of_[p] >= 0) {
            z = latents_[li].data() + static_cast<size_t>(latent_of_[p]) * lb;
            refs.push_back(refs_[li].data() + static_cast<size_t>(latent_of_[p]) * kk);
        } else {
            if (!plan_done_[li]) {
                return failed_precondition("DeltaKV layer " + std::to_string(layer) +
                                           ": rows asked for before the layer compressed them");
            }
            const size_t j =
                static_cast<size_t>(std::lower_bound(plan_tokens_.begin(), plan_tokens_.end(), p) -
                                    plan_tokens_.begin());
            z = pending_latents_[li].data() + j * lb;
            refs.push_back(pending_refs_[li].data() + j * kk);
        }
        w.bytes(z, lb);
    }
    for (const uint16_t* r : refs) w.bytes(r, sizeof(uint16_t) * kk);
    return out;
}

Status DeltaKvSequenceCache::begin_rows_import(int32_t n) {
    if (n < 0 || n > options_.n_ctx) return data_loss("DeltaKV rows state: invalid token count");
    DS_RETURN_IF_ERROR(reserve(n));
    n_reserved_ = 0;
    n_tokens_ = n;
    comp_end_ = options_.sinks;
    rows_import_ = true;
    kinds_end_ = options_.sinks;
    rows_latents_ = 0;
    buffer_from_.assign(sparse_layers_.size(), INT32_MAX);
    for (size_t sl = 0; sl < sparse_layers_.size(); ++sl) {
        latents_[sl].clear();
        refs_[sl].clear();
    }
    sync_ref_list();
    zero_rows();
    return {};
}

Status DeltaKvSequenceCache::import_rows(int32_t layer, int32_t begin, int32_t end,
                                         std::span<const uint8_t> part) {
    if (!rows_import_) return failed_precondition("DeltaKV: rows come after a rows state");
    if (layer < 0 || layer >= options_.n_layers) return invalid_argument("no such layer");
    const std::string where = "DeltaKV layer " + std::to_string(layer) + " rows [" +
                              std::to_string(begin) + ", " + std::to_string(end) + ")";
    if (begin < 0 || begin > end || end > n_tokens_) {
        return invalid_argument(where + " are not in the imported state (" +
                                std::to_string(n_tokens_) + " tokens)");
    }
    const bool full = options_.full_layer[layer];
    SlotPool& pool = full ? *full_pool_ : *sparse_pool_;
    const int32_t li = layer_index_[layer];
    const size_t row = pool.row_bytes();
    ByteReader r(part);
    if (full) {
        if (part.size() != 2 * row * static_cast<size_t>(end - begin)) {
            return data_loss(where + ": " + std::to_string(part.size()) + " bytes");
        }
        for (int32_t p = begin; p < end; ++p) r.bytes(pool.k_row(li, full_slot_[p]), row);
        for (int32_t p = begin; p < end; ++p) r.bytes(pool.v_row(li, full_slot_[p]), row);
        return {};
    }
    int32_t region = 0;
    if (!r.i32(region) || region < options_.sinks || region > n_tokens_) {
        return data_loss(where + ": no valid region end");
    }
    // The region only grows, over tokens no layer took as the buffer yet.
    const int32_t buffer_from = *std::min_element(buffer_from_.begin(), buffer_from_.end());
    if ((region > comp_end_ && buffer_from < region) ||
        (end > region && std::max(begin, region) < comp_end_)) {
        return data_loss(where + ": the compressed region differs between layers");
    }
    const int32_t rb = std::max(begin, options_.sinks), re = std::min(end, region);
    const int32_t n_bits = std::max(0, re - rb);
    const auto bits = r.take(static_cast<size_t>((n_bits + 7) / 8));
    if (bits.size() != static_cast<size_t>((n_bits + 7) / 8))
        return data_loss(where + ": truncated");
    if (n_bits > 0 && rb > kinds_end_) return data_loss(where + ": a gap in the region");
    const auto bit = [&](int32_t p) { return (bits[(p - rb) / 8] >> ((p - rb) % 8)) & 1; };
    std::vector<int32_t> fp, latent;
    for (int32_t p = begin; p < end; ++p) {
        const bool in_region = p >= rb && p < re;
        if (in_region && p < kinds_end_ && (bit(p) != 0) != (ref_flag_[p] != 0)) {
            return data_loss(where + ": token " + std::to_string(p) +
                             " is a reference in one layer and not in another");
        }
        (in_region && !bit(p) ? latent : fp).push_back(p);
    }
    const size_t lb = latent_bytes(), kk = static_cast<size_t>(options_.k);
    if (r.remaining() != 2 * row * fp.size() + latent.size() * (lb + sizeof(uint16_t) * kk)) {
        return data_loss(where + ": " + std::to_string(part.size()) + " bytes, not what its " +
                         std::to_string(fp.size()) + " full-precision tokens and " +
                         std::to_string(latent.size()) + " latents take");
    }
    if (!latent.empty()) {
        const int32_t first = latent[0] < kinds_end_ ? latent_of_[latent[0]] : rows_latents_;
        if (latents_[li].size() != static_cast<size_t>(first) * lb) {
            return data_loss(where + ": latents out of order");
        }
    }
    // Reference ordinals count the sinks, then the region's references once this part is in.
    std::vector<int32_t> refs_after = ref_list_;
    for (int32_t p = std::max(rb, kinds_end_); p < re; ++p) {
        if (bit(p)) refs_after.push_back(p);
    }
    std::vector<uint16_t> refs(latent.size() * kk);
    std::memcpy(refs.data(), part.data() + (part.size() - refs.size() * sizeof(uint16_t)),
                refs.size() * sizeof(uint16_t));
    for (size_t i = 0; i < refs.size(); ++i) {
        const int32_t o = refs[i];
        if (o == kNoRef) continue;
        const int32_t ref = o < options_.sinks ? o
                            : o - options_.sinks < static_cast<int32_t>(refs_after.size())
                                ? refs_after[o - options_.sinks]
                                : INT32_MAX;
        if (ref > latent[i / kk]) {
            return data_loss(where + ": a latent names a token that is not a reference");
        }
    }
    // Checked: take it. Tokens new to the region get their kind; a latent's slot is freed.
    std::vector<int32_t> freed;
    for (int32_t p = std::max(rb, kinds_end_); p < re; ++p) {
        ref_flag_[p] = static_cast<uint8_t>(bit(p));
        if (ref_flag_[p]) continue;
        freed.push_back(sparse_slot_[p]);
        sparse_slot_[p] = -1;
        latent_of_[p] = rows_latents_++;
    }
    sparse_pool_->release(freed);
    sync_ref_list();
    kinds_end_ = std::max(kinds_end_, re);
    comp_end_ = std::max(comp_end_, region);
    if (end > region) buffer_from_[li] = std::min(buffer_from_[li], std::max(begin, region));
    for (int32_t p : fp) r.bytes(pool.k_row(li, sparse_slot_[p]), row);
    for (int32_t p : fp) r.bytes(pool.v_row(li, sparse_slot_[p]), row);
    const auto z = r.take(latent.size() * lb);
    latents_[li].insert(latents_[li].end(), z.begin(), z.end());
    refs_[li].insert(refs_[li].end(), refs.begin(), refs.end());
    return {};
}

}  // namespace deltaserve::kvstore
