// Shipping a DeltaKV session: what it holds (full layers, full-precision tokens, latents and
// their references), never the reconstructed or full KV.
#include <algorithm>

#include "byte_io.h"
#include "deltaserve/kvstore/deltakv_cache.h"

namespace deltaserve::kvstore {
namespace {

// The slots of a layer's full-precision tokens, in position order: what its part carries.
std::vector<int32_t> held_slots(const std::vector<int32_t>& slot_of, int32_t n_tokens) {
    std::vector<int32_t> slots;
    for (int32_t p = 0; p < n_tokens; ++p) {
        if (slot_of[p] >= 0) slots.push_back(slot_of[p]);
    }
    return slots;
}

}  // namespace

std::vector<uint8_t> DeltaKvSequenceCache::state_head(int32_t n_tokens, int32_t region_end) const {
    std::vector<uint8_t> out;
    ByteWriter w(out);
    for (int32_t v : {n_tokens, region_end, options_.sinks, options_.k, options_.latent_bits,
                      profile_.m, static_cast<int32_t>(sparse_layers_.size())}) {
        w.i32(v);
    }
    for (int32_t l = 0; l < options_.n_layers; ++l) out.push_back(options_.full_layer[l]);
    return out;
}

Result<std::vector<uint8_t>> DeltaKvSequenceCache::export_state() const {
    if (n_reserved_ != 0)
        return failed_precondition("cannot export a cache with reserved positions");
    std::vector<uint8_t> out = state_head(n_tokens_, comp_end_);
    ByteWriter w(out);
    const int32_t region = comp_end_ - options_.sinks;
    std::vector<uint8_t> bits(static_cast<size_t>((region + 7) / 8), 0);
    for (int32_t i = 0; i < region; ++i) {
        if (ref_flag_[options_.sinks + i]) bits[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
    }
    w.bytes(bits.data(), bits.size());
    return out;
}

std::vector<uint8_t> DeltaKvSequenceCache::export_hints() const { return hints_.export_pins(); }

Status DeltaKvSequenceCache::import_hints(std::span<const uint8_t> hints) {
    return hints_.import_pins(hints, options_.sinks, comp_end_);
}

Status DeltaKvSequenceCache::import_state(std::span<const uint8_t> state) {
    if (n_tokens_ != 0 || n_reserved_ != 0) {
        return failed_precondition("importing into a cache that is not empty");
    }
    ByteReader r(state);
    int32_t v[7];
    for (int32_t& x : v) {
        if (!r.i32(x)) return data_loss("DeltaKV state: truncated");
    }
    const int32_t n = v[0], comp_end = v[1];

    if (v[2] != options_.sinks || v[3] != options_.k || v[4] != options_.latent_bits ||
        v[5] != profile_.m || v[6] != static_cast<int32_t>(sparse_layers_.size())) {
        return failed_precondition(
            "DeltaKV state: made with other settings (sinks, k, latent bits, m or layer roles)");
    }
    std::vector<uint8_t> roles(static_cast<size_t>(options_.n_layers));
    if (!r.bytes(roles.data(), roles.size()) || roles != options_.full_layer) {
        return failed_precondition("DeltaKV state: other full-attention layers");
    }
    if (comp_end == kRowsState) {
        if (r.remaining() != 0) return data_loss("DeltaKV rows state: trailing bytes");
        return begin_rows_import(n);
    }
    rows_import_ = false;
    if (n < 0 || n > options_.n_ctx || comp_end < options_.sinks ||
        comp_end > std::max(n, options_.sinks)) {
        return data_loss("DeltaKV state: invalid token counts");
    }
    const int32_t region = comp_end - options_.sinks;
    auto bits = r.take(static_cast<size_t>((region + 7) / 8));
    if (bits.size() != static_cast<size_t>((region + 7) / 8) || r.remaining() != 0) {
        return data_loss("DeltaKV state: malformed reference map");
    }
    DS_RETURN_IF_ERROR(reserve(n));
    std::vector<int32_t> freed;
    int32_t latents = 0;
    for (int32_t i = 0; i < region; ++i) {
        const int32_t p = options_.sinks + i;
        ref_flag_[p] = (bits[i / 8] >> (i % 8)) & 1;
        if (ref_flag_[p]) continue;
        freed.push_back(sparse_slot_[p]);
        sparse_slot_[p] = -1;
        latent_of_[p] = latents++;
    }
    if (sparse_pool_) sparse_pool_->release(freed);
    sync_ref_list();
    n_reserved_ = 0;
    n_tokens_ = n;
    comp_end_ = comp_end;
    // Until its layer arrives, a sparse layer reconstructs from zero latents and no
    // references, and full-precision rows read zeros: memory-safe, never read as real KV.
    const size_t lb = latent_bytes();
    for (size_t sl = 0; sl < sparse_layers_.size(); ++sl) {
        latents_[sl].assign(static_cast<size_t>(latents) * lb, 0);
        refs_[sl].assign(static_cast<size_t>(latents) * options_.k, kNoRef);
    }
    zero_rows();
    return {};
}

void DeltaKvSequenceCache::zero_rows() {
    const size_t row = full_pool_->row_bytes();
    for (int32_t p = 0; p < n_tokens_; ++p) {
        for (size_t fl = 0; fl < full_layers_.size(); ++fl) {
            std::memset(full_pool_->k_row(static_cast<int32_t>(fl), full_slot_[p]), 0, row);
            std::memset(full_pool_->v_row(static_cast<int32_t>(fl), full_slot_[p]), 0, row);
        }
        for (size_t sl = 0; sparse_slot_[p] >= 0 && sl < sparse_layers_.size(); ++sl) {
            std::memset(sparse_pool_->k_row(static_cast<int32_t>(sl), sparse_slot_[p]), 0, row);
            std::memset(sparse_pool_->v_row(static_cast<int32_t>(sl), sparse_slot_[p]), 0, row);
        }
    }
}

Result<std::vector<uint8_t>> DeltaKvSequenceCache::export_layer(int32_t layer) const {
    if (layer < 0 || layer >= options_.n_layers) return invalid_argument("no such layer");
    if (n_reserved_ != 0)
        return failed_precondition("cannot export a cache with reserved positions");
    const bool full = options_.full_layer[layer];
    const SlotPool& pool = full ? *full_pool_ : *sparse_pool_;
    const std::vector<int32_t>& slot_of = full ? full_slot_ : sparse_slot_;
    const int32_t li = layer_index_[layer];
    const size_t row = pool.row_bytes();
    const std::vector<int32_t> slots = held_slots(slot_of, n_tokens_);
    std::vector<uint8_t> out;
    out.reserve(2 * row * slots.size() +
                (full ? 0 : latents_[li].size() + sizeof(uint16_t) * refs_[li].size()));
    ByteWriter w(out);
    for (int32_t s : slots) w.bytes(pool.k_base(li) + s * row, row);
    for (int32_t s : slots) w.bytes(pool.v_base(li) + s * row, row);
    if (!full) {
        w.bytes(latents_[li].data(), latents_[li].size());
        w.bytes(refs_[li].data(), refs_[li].size() * sizeof(uint16_t));
    }
    return out;
}

Status DeltaKvSequenceCache::import_layer(int32_t layer, std::span<const uint8_t> part) {
    if (rows_import_) return import_rows(layer, 0, n_tokens_, part);
    if (layer < 0 || layer >= options_.n_layers) return invalid_argument("no such layer");
    const bool full = options_.full_layer[layer];
    SlotPool& pool = full ? *full_pool_ : *sparse_pool_;
    const std::vector<int32_t>& slot_of = full ? full_slot_ : sparse_slot_;
    const int32_t li = layer_index_[layer];
    const size_t row = pool.row_bytes();
    const std::vector<int32_t> slots = held_slots(slot_of, n_tokens_);
    const size_t latent_part = full ? 0 : latents_[li].size();
    const size_t refs_part = full ? 0 : refs_[li].size() * sizeof(uint16_t);
    const size_t want = 2 * row * slots.size() + latent_part + refs_part;
    if (part.size() != want) {
        return data_loss("DeltaKV layer " + std::to_string(layer) + ": " +
                         std::to_string(part.size()) + " bytes, expected " + std::to_string(want));
    }
    ByteReader r(part);
    if (!full) {
        // Reference ordinals must name references at or before their latent's token.
        std::vector<uint16_t> refs(refs_[li].size());
        std::memcpy(refs.data(), part.data() + 2 * row * slots.size() + latent_part, refs_part);
        const size_t n_refs = static_cast<size_t>(options_.sinks) + ref_list_.size();
        for (int32_t p = options_.sinks, lat = 0; p < comp_end_; ++p) {
            if (latent_of_[p] < 0) continue;
            for (int32_t q = 0; q < options_.k; ++q) {
                const uint16_t ref = refs[static_cast<size_t>(lat) * options_.k + q];
                if (ref != kNoRef && (ref >= n_refs || ref_position(ref) > p)) {
                    return data_loss("DeltaKV layer " + std::to_string(layer) +
                                     ": a latent names a token that is not a reference");
                }
            }
            ++lat;
        }
        for (int32_t s : slots) r.bytes(pool.k_row(li, s), row);
        for (int32_t s : slots) r.bytes(pool.v_row(li, s), row);
        r.bytes(latents_[li].data(), latent_part);
        refs_[li] = std::move(refs);
        return {};
    }
    for (int32_t s : slots) r.bytes(pool.k_row(li, s), row);
    for (int32_t s : slots) r.bytes(pool.v_row(li, s), row);
    return {};
}

}  // namespace deltaserve::kvstore
