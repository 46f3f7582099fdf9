// Layer-wise shipping of a DeltaKV session while its prefill runs: a range of a layer's
// positions as the session will hold them after the forward call's commit (the blocks it
// compresses were compressed at the layer's observe; with exact_share, once the last
// judging layer compressed them), and taking such ranges back.
#include <algorithm>
#include <climits>
#include <cstring>
#include <string>

#include "byte_io.h"
#include "deltakv_codec.h"

namespace deltaserve::kvstore {

int32_t DeltaKvCodec::rows_final_end(int32_t layer, bool last) const {
    const int32_t stored = c_.n_tokens_ + c_.n_reserved_;
    if (layer < 0 || layer >= c_.options_.n_layers || c_.options_.full_layer[layer] ||
        c_.options_.is_window_layer(layer))
        return stored;
    // Which of the plan's tokens stay exact is known once every judging layer compressed it.
    if (c_.exact_pending()) return std::min(stored, c_.region_.end);
    return last ? stored : std::min(stored, c_.region_end());
}

Result<std::vector<uint8_t>> DeltaKvCodec::export_rows_state(int32_t n_tokens) const {
    if (n_tokens < 0) return invalid_argument("a negative token count");
    return state_head(n_tokens, kRowsState);
}

Result<std::vector<uint8_t>> DeltaKvCodec::export_rows(int32_t layer, int32_t begin,
                                                       int32_t end) const {
    if (layer < 0 || layer >= c_.options_.n_layers) return invalid_argument("no such layer");
    const int32_t stored = c_.n_tokens_ + c_.n_reserved_;
    if (begin < 0 || begin > end || end > stored) {
        return invalid_argument("rows [" + std::to_string(begin) + ", " + std::to_string(end) +
                                ") are not in the cache (" + std::to_string(stored) + ")");
    }
    if (c_.options_.is_window_layer(layer)) return export_window_rows(layer, begin, end);
    const bool full = c_.options_.full_layer[layer];
    const SlotPool& pool = full ? *c_.full_pool_ : *c_.sparse_pool_;
    const int32_t li = c_.layer_index_[layer];
    std::vector<uint8_t> out;
    ByteWriter w(out);
    if (full) {
        DS_RETURN_IF_ERROR(append_pool_rows(
            w, pool, li,
            std::span<const int32_t>(c_.full_slot_)
                .subspan(static_cast<size_t>(begin), static_cast<size_t>(end - begin))));
        return out;
    }
    const int32_t region = c_.region_end();
    if (c_.exact_pending() && end > c_.region_.end) {
        return failed_precondition(
            "DeltaKV layer " + std::to_string(layer) + ": rows past " +
            std::to_string(c_.region_.end) +
            " asked for before the judging layers compressed them (exact_share)");
    }
    const int32_t rb = std::max(begin, c_.options_.sinks), re = std::min(end, region);
    w.i32(region);
    std::vector<uint8_t> bits(static_cast<size_t>((std::max(0, re - rb) + 7) / 8), 0);
    std::vector<int32_t> fp, latent;
    for (int32_t p = begin; p < end; ++p) {
        const bool in_region = p >= rb && p < re;
        if (in_region && c_.region_.ref_flag[p])
            bits[(p - rb) / 8] |= static_cast<uint8_t>(1u << ((p - rb) % 8));
        (in_region && !c_.region_.ref_flag[p] ? latent : fp).push_back(p);
    }
    w.bytes(bits.data(), bits.size());
    std::vector<int32_t> fp_slots;
    for (int32_t p : fp) fp_slots.push_back(c_.sparse_slot_[p]);
    DS_RETURN_IF_ERROR(append_pool_rows(w, pool, li, fp_slots));
    // A latent is in the region already, or made by this call's compression of the layer.
    const size_t lb = c_.latent_bytes();
    const int32_t kk = c_.options_.k;
    std::vector<const uint16_t*> refs;
    std::vector<uint8_t> errors;
    for (int32_t p : latent) {
        const uint8_t* z = nullptr;
        if (c_.region_.latent_of[p] >= 0) {
            const auto at = static_cast<size_t>(c_.region_.latent_of[p]);
            z = c_.region_.latents[li].data() + at * lb;
            refs.push_back(c_.region_.refs[li].data() + at * kk);
            errors.push_back(c_.region_.errors[li][at]);
        } else {
            if (!c_.plan_.done[li]) {
                return failed_precondition("DeltaKV layer " + std::to_string(layer) +
                                           ": rows asked for before the layer compressed them");
            }
            const size_t j = static_cast<size_t>(
                std::lower_bound(c_.plan_.tokens.begin(), c_.plan_.tokens.end(), p) -
                c_.plan_.tokens.begin());
            z = c_.plan_.latents[li].data() + j * lb;
            refs.push_back(c_.plan_.refs[li].data() + j * kk);
            errors.push_back(c_.plan_.errors[li][j]);
        }
        w.bytes(z, lb);
    }
    for (const uint16_t* r : refs) w.bytes(r, sizeof(uint16_t) * kk);
    w.bytes(errors.data(), errors.size());
    return out;
}

Status DeltaKvCodec::begin_rows_import(int32_t n) {
    c_.forget_mirrors();  // the latents are rewritten
    if (n < 0 || n > c_.options_.n_ctx) return data_loss("DeltaKV rows state: invalid token count");
    DS_RETURN_IF_ERROR(c_.reserve(n));
    c_.n_reserved_ = 0;
    c_.n_tokens_ = n;
    c_.drop_window_before(n);  // window layers take the rows the window ending at n reaches
    c_.region_.end = c_.options_.sinks;
    rows_import_ = true;
    kinds_end_ = c_.options_.sinks;
    rows_latents_ = 0;
    buffer_from_.assign(c_.sparse_layers_.size(), INT32_MAX);
    for (size_t sl = 0; sl < c_.sparse_layers_.size(); ++sl) {
        c_.region_.latents[sl].clear();
        c_.region_.refs[sl].clear();
        c_.region_.errors[sl].clear();
    }
    c_.region_.sync_ref_list();
    return zero_rows();
}

Status DeltaKvCodec::import_rows(int32_t layer, int32_t begin, int32_t end,
                                 std::span<const uint8_t> part) {
    if (!rows_import_) return failed_precondition("DeltaKV: rows come after a rows state");
    if (layer < 0 || layer >= c_.options_.n_layers) return invalid_argument("no such layer");
    const std::string where = "DeltaKV layer " + std::to_string(layer) + " rows [" +
                              std::to_string(begin) + ", " + std::to_string(end) + ")";
    if (begin < 0 || begin > end || end > c_.n_tokens_) {
        return invalid_argument(where + " are not in the imported state (" +
                                std::to_string(c_.n_tokens_) + " tokens)");
    }
    if (c_.options_.is_window_layer(layer)) return import_window_rows(layer, begin, end, part);
    const bool full = c_.options_.full_layer[layer];
    SlotPool& pool = full ? *c_.full_pool_ : *c_.sparse_pool_;
    const int32_t li = c_.layer_index_[layer];
    const size_t row = pool.row_bytes();
    ByteReader r(part);
    if (full) {
        if (part.size() != 2 * row * static_cast<size_t>(end - begin)) {
            return data_loss(where + ": " + std::to_string(part.size()) + " bytes");
        }
        return pool.write_rows(
            li,
            std::span<const int32_t>(c_.full_slot_)
                .subspan(static_cast<size_t>(begin), static_cast<size_t>(end - begin)),
            r.take(part.size()).data());
    }
    int32_t region = 0;
    if (!r.i32(region) || region < c_.options_.sinks || region > c_.n_tokens_) {
        return data_loss(where + ": no valid region end");
    }
    // The region only grows, over tokens no layer took as the buffer yet.
    const int32_t buffer_from = *std::min_element(buffer_from_.begin(), buffer_from_.end());
    if ((region > c_.region_.end && buffer_from < region) ||
        (end > region && std::max(begin, region) < c_.region_.end)) {
        return data_loss(where + ": the compressed region differs between layers");
    }
    const int32_t rb = std::max(begin, c_.options_.sinks), re = std::min(end, region);
    const int32_t n_bits = std::max(0, re - rb);
    const auto bits = r.take(static_cast<size_t>((n_bits + 7) / 8));
    if (bits.size() != static_cast<size_t>((n_bits + 7) / 8))
        return data_loss(where + ": truncated");
    if (n_bits > 0 && rb > kinds_end_) return data_loss(where + ": a gap in the region");
    const auto bit = [&](int32_t p) { return (bits[(p - rb) / 8] >> ((p - rb) % 8)) & 1; };
    std::vector<int32_t> fp, latent;
    for (int32_t p = begin; p < end; ++p) {
        const bool in_region = p >= rb && p < re;
        if (in_region && p < kinds_end_ && (bit(p) != 0) != (c_.region_.ref_flag[p] != 0)) {
            return data_loss(where + ": token " + std::to_string(p) +
                             " is a reference in one layer and not in another");
        }
        (in_region && !bit(p) ? latent : fp).push_back(p);
    }
    const size_t lb = c_.latent_bytes(), kk = static_cast<size_t>(c_.options_.k);
    if (r.remaining() != 2 * row * fp.size() + latent.size() * (lb + sizeof(uint16_t) * kk + 1)) {
        return data_loss(where + ": " + std::to_string(part.size()) + " bytes, not what its " +
                         std::to_string(fp.size()) + " full-precision tokens and " +
                         std::to_string(latent.size()) + " latents take");
    }
    if (!latent.empty()) {
        const int32_t first =
            latent[0] < kinds_end_ ? c_.region_.latent_of[latent[0]] : rows_latents_;
        if (c_.region_.latents[li].size() != static_cast<size_t>(first) * lb) {
            return data_loss(where + ": latents out of order");
        }
    }
    // Reference ordinals count the sinks, then the region's references once this part is in.
    std::vector<int32_t> refs_after = c_.region_.ref_list;
    for (int32_t p = std::max(rb, kinds_end_); p < re; ++p) {
        if (bit(p)) refs_after.push_back(p);
    }
    std::vector<uint16_t> refs(latent.size() * kk);
    if (!refs.empty()) {  // (a part without latents: memcpy takes no null pointer)
        std::memcpy(refs.data(),
                    part.data() + (part.size() - latent.size() - refs.size() * sizeof(uint16_t)),
                    refs.size() * sizeof(uint16_t));
    }
    for (size_t i = 0; i < refs.size(); ++i) {
        const int32_t o = refs[i];
        if (o == kNoRef) continue;
        const int32_t ref = o < c_.options_.sinks ? o
                            : o - c_.options_.sinks < static_cast<int32_t>(refs_after.size())
                                ? refs_after[o - c_.options_.sinks]
                                : INT32_MAX;
        if (ref > latent[i / kk]) {
            return data_loss(where + ": a latent names a token that is not a reference");
        }
    }
    // Checked: take it. Tokens new to the region get their kind; a latent's slot is freed.
    std::vector<int32_t> freed;
    for (int32_t p = std::max(rb, kinds_end_); p < re; ++p) {
        c_.region_.ref_flag[p] = static_cast<uint8_t>(bit(p));
        if (c_.region_.ref_flag[p]) continue;
        freed.push_back(c_.sparse_slot_[p]);
        c_.sparse_slot_[p] = -1;
        c_.region_.latent_of[p] = rows_latents_++;
    }
    c_.sparse_pool_->release(freed);
    c_.region_.sync_ref_list();
    kinds_end_ = std::max(kinds_end_, re);
    c_.region_.end = std::max(c_.region_.end, region);
    if (end > region) buffer_from_[li] = std::min(buffer_from_[li], std::max(begin, region));
    std::vector<int32_t> fp_slots;
    for (int32_t p : fp) fp_slots.push_back(c_.sparse_slot_[p]);
    DS_RETURN_IF_ERROR(pool.write_rows(li, fp_slots, r.take(2 * row * fp.size()).data()));
    const auto z = r.take(latent.size() * lb);
    c_.region_.latents[li].insert(c_.region_.latents[li].end(), z.begin(), z.end());
    c_.region_.refs[li].insert(c_.region_.refs[li].end(), refs.begin(), refs.end());
    r.take(refs.size() * sizeof(uint16_t));  // taken above
    const auto errors = r.take(latent.size());
    c_.region_.errors[li].insert(c_.region_.errors[li].end(), errors.begin(), errors.end());
    return {};
}

Result<std::vector<uint8_t>> DeltaKvCodec::export_window_rows(int32_t layer, int32_t begin,
                                                              int32_t end) const {
    const int32_t first = std::min(end, std::max(begin, c_.window_from_));
    std::vector<uint8_t> out;
    ByteWriter w(out);
    w.i32(first);
    DS_RETURN_IF_ERROR(append_pool_rows(
        w, *c_.window_pool_, c_.layer_index_[layer],
        std::span<const int32_t>(c_.window_slot_)
            .subspan(static_cast<size_t>(first), static_cast<size_t>(end - first))));
    return out;
}

Status DeltaKvCodec::import_window_rows(int32_t layer, int32_t begin, int32_t end,
                                        std::span<const uint8_t> part) {
    const std::string where = "DeltaKV window layer " + std::to_string(layer) + " rows [" +
                              std::to_string(begin) + ", " + std::to_string(end) + ")";
    ByteReader r(part);
    int32_t first = 0;
    if (!r.i32(first) || first < begin || first > end)
        return data_loss(where + ": a part without its first position");
    // Every row the cache holds (from window_first()) must come.
    const int32_t from = std::max(begin, c_.window_from_);
    if (first > from) {
        return data_loss(where + ": the rows from " + std::to_string(first) +
                         ", but the window needs them from " + std::to_string(from));
    }
    const size_t row = c_.window_pool_->row_bytes();
    const auto n = static_cast<size_t>(end - first);
    if (r.remaining() != 2 * row * n) {
        return data_loss(where + ": " + std::to_string(part.size()) + " bytes, expected " +
                         std::to_string(4 + 2 * row * n));
    }
    if (from >= end) return {};
    // The part is K rows then V rows from `first`: take the held ones of each.
    const auto held = static_cast<size_t>(end - from), skip = static_cast<size_t>(from - first);
    const uint8_t* rows = part.data() + 4;
    std::vector<uint8_t> taken;
    if (skip > 0) {
        taken.resize(2 * row * held);
        std::memcpy(taken.data(), rows + skip * row, held * row);
        std::memcpy(taken.data() + held * row, rows + (n + skip) * row, held * row);
        rows = taken.data();
    }
    return c_.window_pool_->write_rows(
        c_.layer_index_[layer],
        std::span<const int32_t>(c_.window_slot_).subspan(static_cast<size_t>(from), held), rows);
}

}  // namespace deltaserve::kvstore
