// Shipping a DeltaKV session: what it holds (full layers, full-precision tokens, latents and
// their references), never the reconstructed or full KV.
#include <algorithm>
#include <cmath>
#include <limits>

#include "byte_io.h"
#include "deltakv_codec.h"

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

Status append_pool_rows(ByteWriter& w, const SlotPool& pool, int32_t layer,
                        std::span<const int32_t> slots) {
    std::vector<uint8_t> rows(2 * pool.row_bytes() * slots.size());
    DS_RETURN_IF_ERROR(pool.read_rows(layer, slots, rows.data()));
    w.bytes(rows.data(), rows.size());
    return Status();
}

std::vector<uint8_t> DeltaKvCodec::roles() const {
    std::vector<uint8_t> out(static_cast<size_t>(c_.options_.n_layers));
    for (int32_t l = 0; l < c_.options_.n_layers; ++l)
        out[l] = c_.options_.is_window_layer(l) ? 2 : c_.options_.full_layer[l];
    return out;
}

std::vector<uint8_t> DeltaKvCodec::state_head(int32_t n_tokens, int32_t region_end) const {
    std::vector<uint8_t> out;
    ByteWriter w(out);
    for (int32_t v :
         {n_tokens, region_end, c_.options_.sinks, c_.options_.k, c_.options_.latent_bits,
          c_.profile_.m, static_cast<int32_t>(c_.sparse_layers_.size())}) {
        w.i32(v);
    }
    const std::vector<uint8_t> r = roles();
    w.bytes(r.data(), r.size());
    if (!c_.window_layers_.empty()) {  // the window, and the layer count: the roles are whole
        w.i32(c_.options_.sliding_window);
        w.i32(c_.options_.n_layers);
    }
    return out;
}

Result<std::vector<uint8_t>> DeltaKvCodec::export_state() const {
    if (c_.n_reserved_ != 0)
        return failed_precondition("cannot export a cache with reserved positions");
    std::vector<uint8_t> out = state_head(c_.n_tokens_, c_.region_.end);
    ByteWriter w(out);
    const int32_t region = c_.region_.end - c_.options_.sinks;
    std::vector<uint8_t> bits(static_cast<size_t>((region + 7) / 8), 0);
    for (int32_t i = 0; i < region; ++i) {
        if (c_.region_.ref_flag[c_.options_.sinks + i])
            bits[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
    }
    w.bytes(bits.data(), bits.size());
    return out;
}

std::vector<uint8_t> DeltaKvCodec::export_hints() const { return c_.hints_.export_pins(); }

Status DeltaKvCodec::import_hints(std::span<const uint8_t> hints) {
    return c_.hints_.import_pins(hints, c_.options_.sinks, c_.region_.end);
}

Status DeltaKvCodec::import_state(std::span<const uint8_t> state) {
    c_.forget_mirrors();  // the latents are rewritten
    if (c_.n_tokens_ != 0 || c_.n_reserved_ != 0) {
        return failed_precondition("importing into a cache that is not empty");
    }
    ByteReader r(state);
    int32_t v[7];
    for (int32_t& x : v) {
        if (!r.i32(x)) return data_loss("DeltaKV state: truncated");
    }
    const int32_t n = v[0], comp_end = v[1];

    if (v[2] != c_.options_.sinks || v[3] != c_.options_.k || v[4] != c_.options_.latent_bits ||
        v[5] != c_.profile_.m || v[6] != static_cast<int32_t>(c_.sparse_layers_.size())) {
        return failed_precondition(
            "DeltaKV state: made with other settings (sinks, k, latent bits, m or layer roles)");
    }
    std::vector<uint8_t> theirs(static_cast<size_t>(c_.options_.n_layers));
    if (!r.bytes(theirs.data(), theirs.size()) || theirs != roles()) {
        return failed_precondition("DeltaKV state: other full-attention or window layers");
    }
    if (!c_.window_layers_.empty()) {
        int32_t window = 0, n_layers = 0;
        if (!r.i32(window) || !r.i32(n_layers) || n_layers != c_.options_.n_layers)
            return data_loss("DeltaKV state: truncated");
        if (window != c_.options_.sliding_window) {
            return failed_precondition("DeltaKV state: window layers of " + std::to_string(window) +
                                       " tokens, this cache's are " +
                                       std::to_string(c_.options_.sliding_window));
        }
    }
    if (comp_end == kRowsState) {
        if (r.remaining() != 0) return data_loss("DeltaKV rows state: trailing bytes");
        return begin_rows_import(n);
    }
    rows_import_ = false;
    if (n < 0 || n > c_.options_.n_ctx || comp_end < c_.options_.sinks ||
        comp_end > std::max(n, c_.options_.sinks)) {
        return data_loss("DeltaKV state: invalid token counts");
    }
    const int32_t region = comp_end - c_.options_.sinks;
    auto bits = r.take(static_cast<size_t>((region + 7) / 8));
    if (bits.size() != static_cast<size_t>((region + 7) / 8) || r.remaining() != 0) {
        return data_loss("DeltaKV state: malformed reference map");
    }
    DS_RETURN_IF_ERROR(c_.reserve(n));
    std::vector<int32_t> freed;
    int32_t latents = 0;
    for (int32_t i = 0; i < region; ++i) {
        const int32_t p = c_.options_.sinks + i;
        c_.region_.ref_flag[p] = (bits[i / 8] >> (i % 8)) & 1;
        if (c_.region_.ref_flag[p]) continue;
        freed.push_back(c_.sparse_slot_[p]);
        c_.sparse_slot_[p] = -1;
        c_.region_.latent_of[p] = latents++;
    }
    if (c_.sparse_pool_) c_.sparse_pool_->release(freed);
    c_.region_.sync_ref_list();
    c_.n_reserved_ = 0;
    c_.n_tokens_ = n;
    c_.drop_window_before(n);  // window layers take the rows the window ending at n reaches
    c_.region_.end = comp_end;
    // Until its layer arrives, a sparse layer reconstructs from zero latents and no
    // references, and full-precision rows read zeros: memory-safe, never read as real KV.
    const size_t lb = c_.latent_bytes();
    for (size_t sl = 0; sl < c_.sparse_layers_.size(); ++sl) {
        c_.region_.latents[sl].assign(static_cast<size_t>(latents) * lb, 0);
        c_.region_.refs[sl].assign(static_cast<size_t>(latents) * c_.options_.k, kNoRef);
        c_.region_.errors[sl].assign(static_cast<size_t>(latents), 0);
    }
    return zero_rows();
}

Status DeltaKvCodec::zero_rows() {
    const std::vector<int32_t> full = held_slots(c_.full_slot_, c_.n_tokens_);
    const std::vector<int32_t> sparse = held_slots(c_.sparse_slot_, c_.n_tokens_);
    for (size_t fl = 0; fl < c_.full_layers_.size(); ++fl)
        DS_RETURN_IF_ERROR(c_.full_pool_->write_rows(static_cast<int32_t>(fl), full, nullptr));
    for (size_t sl = 0; sl < c_.sparse_layers_.size(); ++sl)
        DS_RETURN_IF_ERROR(c_.sparse_pool_->write_rows(static_cast<int32_t>(sl), sparse, nullptr));
    const std::vector<int32_t> window = held_slots(c_.window_slot_, c_.n_tokens_);
    for (size_t wl = 0; wl < c_.window_layers_.size(); ++wl)
        DS_RETURN_IF_ERROR(c_.window_pool_->write_rows(static_cast<int32_t>(wl), window, nullptr));
    return Status();
}

std::vector<float> DeltaKvCodec::rows_error(int32_t begin, int32_t end) const {
    const int32_t n_layers = c_.options_.n_layers;
    std::vector<float> out(static_cast<size_t>(n_layers), std::numeric_limits<float>::quiet_NaN());
    begin = std::max(begin, 0);
    end = std::min(end, c_.n_tokens_);
    for (int32_t l = 0; l < n_layers; ++l) {
        if (c_.options_.full_layer[l] || c_.options_.is_window_layer(l)) continue;
        const auto& codes = c_.region_.errors[c_.layer_index_[l]];
        double sum = 0.0;
        int64_t latents = 0, measured = 0;
        for (int32_t p = begin; p < end; ++p) {
            const int32_t at = c_.region_.latent_of[p];
            if (at < 0) continue;
            ++latents;
            if (static_cast<size_t>(at) < codes.size() && codes[at] != 0) {
                sum += deltakv_error_of_code(codes[at]);
                ++measured;
            }
        }
        if (latents == 0) {
            out[l] = 0.0f;
        } else if (measured > 0) {
            out[l] = static_cast<float>(std::sqrt(sum / static_cast<double>(measured)));
        }
    }
    return out;
}

Result<std::vector<uint8_t>> DeltaKvCodec::export_layer(int32_t layer) const {
    if (layer < 0 || layer >= c_.options_.n_layers) return invalid_argument("no such layer");
    if (c_.n_reserved_ != 0)
        return failed_precondition("cannot export a cache with reserved positions");
    if (c_.options_.is_window_layer(layer)) return export_window_rows(layer, 0, c_.n_tokens_);
    const bool full = c_.options_.full_layer[layer];
    const SlotPool& pool = full ? *c_.full_pool_ : *c_.sparse_pool_;
    const std::vector<int32_t>& slot_of = full ? c_.full_slot_ : c_.sparse_slot_;
    const int32_t li = c_.layer_index_[layer];
    const size_t row = pool.row_bytes();
    const std::vector<int32_t> slots = held_slots(slot_of, c_.n_tokens_);
    std::vector<uint8_t> out;
    out.reserve(2 * row * slots.size() + (full ? 0
                                               : c_.region_.latents[li].size() +
                                                     sizeof(uint16_t) * c_.region_.refs[li].size() +
                                                     c_.region_.errors[li].size()));
    ByteWriter w(out);
    DS_RETURN_IF_ERROR(append_pool_rows(w, pool, li, slots));
    if (!full) {
        w.bytes(c_.region_.latents[li].data(), c_.region_.latents[li].size());
        w.bytes(c_.region_.refs[li].data(), c_.region_.refs[li].size() * sizeof(uint16_t));
        w.bytes(c_.region_.errors[li].data(), c_.region_.errors[li].size());
    }
    return out;
}

Status DeltaKvCodec::import_layer(int32_t layer, std::span<const uint8_t> part) {
    c_.forget_mirrors();  // the latents are rewritten
    if (rows_import_) return import_rows(layer, 0, c_.n_tokens_, part);
    if (layer < 0 || layer >= c_.options_.n_layers) return invalid_argument("no such layer");
    if (c_.options_.is_window_layer(layer)) return import_window_rows(layer, 0, c_.n_tokens_, part);
    const bool full = c_.options_.full_layer[layer];
    SlotPool& pool = full ? *c_.full_pool_ : *c_.sparse_pool_;
    const std::vector<int32_t>& slot_of = full ? c_.full_slot_ : c_.sparse_slot_;
    const int32_t li = c_.layer_index_[layer];
    const size_t row = pool.row_bytes();
    const std::vector<int32_t> slots = held_slots(slot_of, c_.n_tokens_);
    const size_t latent_part = full ? 0 : c_.region_.latents[li].size();
    const size_t refs_part = full ? 0 : c_.region_.refs[li].size() * sizeof(uint16_t);
    const size_t errors_part = full ? 0 : c_.region_.errors[li].size();
    const size_t want = 2 * row * slots.size() + latent_part + refs_part + errors_part;
    if (part.size() != want) {
        return data_loss("DeltaKV layer " + std::to_string(layer) + ": " +
                         std::to_string(part.size()) + " bytes, expected " + std::to_string(want));
    }
    ByteReader r(part);
    if (!full) {
        // Reference ordinals must name references at or before their latent's token.
        std::vector<uint16_t> refs(c_.region_.refs[li].size());
        if (!refs.empty())  // (no latents yet: memcpy takes no null pointer)
            std::memcpy(refs.data(), part.data() + 2 * row * slots.size() + latent_part, refs_part);
        const size_t n_refs = static_cast<size_t>(c_.options_.sinks) + c_.region_.ref_list.size();
        for (int32_t p = c_.options_.sinks, lat = 0; p < c_.region_.end; ++p) {
            if (c_.region_.latent_of[p] < 0) continue;
            for (int32_t q = 0; q < c_.options_.k; ++q) {
                const uint16_t ref = refs[static_cast<size_t>(lat) * c_.options_.k + q];
                if (ref != kNoRef && (ref >= n_refs || c_.region_.ref_position(ref) > p)) {
                    return data_loss("DeltaKV layer " + std::to_string(layer) +
                                     ": a latent names a token that is not a reference");
                }
            }
            ++lat;
        }
        DS_RETURN_IF_ERROR(pool.write_rows(li, slots, r.take(2 * row * slots.size()).data()));
        r.bytes(c_.region_.latents[li].data(), latent_part);
        r.take(refs_part);  // taken above
        r.bytes(c_.region_.errors[li].data(), errors_part);
        c_.region_.refs[li] = std::move(refs);
        return {};
    }
    return pool.write_rows(li, slots, r.take(2 * row * slots.size()).data());
}

}  // namespace deltaserve::kvstore
