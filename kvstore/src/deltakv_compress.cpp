// Compression: which tokens stay references, the plan of what a call compresses, each
// sparse layer's latents, and the slots compaction gives back.
#include "deltaserve/kvstore/deltakv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "deltakv_scratch.h"
#include "row_io.h"

namespace deltaserve::kvstore {

namespace k = deltaserve::kernels;

void DeltaKvSequenceCache::compact() {
    // Every position's row in the lowest slots, so that trim() gives back the rest: after a
    // prompt compressed at its end its latents' slots are holes below its buffer.
    const int32_t end = n_tokens_ + n_reserved_;
    int32_t live = 0;
    for (int32_t p = 0; p < end; ++p) live += sparse_slot_[p] >= 0;
    std::vector<int32_t> movers;
    for (int32_t p = 0; p < end; ++p) {
        if (sparse_slot_[p] >= live) movers.push_back(p);
    }
    if (!movers.empty()) {
        // As many slots below `live` are free as there are rows above it: the lowest ones.
        auto to = sparse_pool_->allocate(static_cast<int32_t>(movers.size()));
        DS_CHECK(to.ok(), "compacting needs no more slots than it frees");
        std::vector<int32_t> from(movers.size());
        for (size_t i = 0; i < movers.size(); ++i) from[i] = sparse_slot_[movers[i]];
        if (!sparse_pool_->move_rows(from, *to).ok()) {
            // (a device's failure) The rows stay where they are; only the memory is not
            // given back.
            sparse_pool_->release(*to);
            return;
        }
        for (size_t i = 0; i < movers.size(); ++i) sparse_slot_[movers[i]] = (*to)[i];
        sparse_pool_->release(from);
    }
    sparse_pool_->trim();
}

void DeltaKvSequenceCache::plan_compression(int32_t n_total) {
    plan_.start(n_total, region_.end);
    if (sparse_layers_.empty()) return;
    const size_t row = static_cast<size_t>(options_.n_kv_heads) * options_.head_dim * 2 * 2;
    const size_t saved =
        sparse_layers_.size() * (row - latent_bytes() - sizeof(uint16_t) * options_.k);
    const double target = options_.keep * static_cast<double>(full_fp16_bytes(
                                              n_total, options_.n_global_layers(),
                                              options_.n_kv_heads * options_.head_dim));
    // The session's bytes before this plan (planning moves no slots): one pass, not one per block.
    const size_t held = options_.keep > 0.0f && n_total - plan_.end >= 2 * options_.window
                            ? bytes_upto(n_total)
                            : 0;
    while (n_total - plan_.end >= 2 * options_.window) {
        // Under a keep target the buffer grows while the session fits: the room goes to the
        // most recent tokens, which draw most of the attention.
        // What the plan saves: each latent's row, less a reference position for each token
        // it keeps exact (exact_share).
        const size_t n = plan_.tokens.size(), e = plan_.exact_count(n, options_.exact_share);
        const double saves =
            static_cast<double>((n - e) * saved) - static_cast<double>(e * sizeof(int32_t));
        if (options_.keep > 0.0f && static_cast<double>(held) - saves <= target) break;
        const int32_t c0 = plan_.end, c1 = plan_.end + options_.window;
        region_.choose_refs(c0, c1);
        for (int32_t p = c0; p < c1; ++p) {
            if (!region_.is_ref(p)) plan_.tokens.push_back(p);
        }
        plan_.blocks.push_back(c1);
        plan_.end = c1;
    }
}

void DeltaKvSequenceCache::drop_plan() {
    // Reference flags past the region are only read once their block is compressed.
    for (int32_t p = region_.end;
         p < plan_.end && p < static_cast<int32_t>(region_.ref_flag.size()); ++p)
        region_.ref_flag[p] = 0;
    plan_.exact_carry = plan_.carry_before;
    region_.sync_ref_list();
    plan_.active = false;
    plan_.blocks.clear();
    plan_.tokens.clear();
    plan_.end = region_.end;
}

void DeltaKvSequenceCache::compress_layer(int32_t s) {
    plan_.done[s] = 1;
    const int32_t d = profile_.d, kk = options_.k, kv_dim = d / 2;
    const size_t lb = latent_bytes();
    auto& lat = plan_.latents[s];
    auto& refs = plan_.refs[s];
    k::PoolRows rows;  // [K before RoPE; V] of a token list's slots
    rows.k = sparse_pool_->k_base(s);
    rows.v = sparse_pool_->v_base(s);
    rows.row_stride = sparse_pool_->row_bytes();
    rows.width = kv_dim;
    std::vector<int32_t> slots, at;
    const auto load_rows = [&](const int32_t* positions, size_t n, float* out) {
        slots.clear();
        at.clear();
        for (size_t i = 0; i < n; ++i) {
            slots.push_back(sparse_slot_[positions[i]]);
            at.push_back(angles(positions[i]));
        }
        sync_mirrors(-1);
        rows.slots = slots.data();
        rows.n = static_cast<int64_t>(n);
        rows.angles = rope_angles(at.data());
        must(backend_->deltakv_pool_rows(rows, out, exec()));
    };
    size_t next = 0;  // first token of the block in plan_.tokens
    for (int32_t c1 : plan_.blocks) {
        // A reference's ordinal is its index among the references before the block's end:
        // the sinks, then region_.ref_list.
        std::vector<int32_t> ref_pos;
        for (int32_t p = 0; p < c1; ++p) {
            if (region_.is_ref(p)) ref_pos.push_back(p);
        }
        size_t end = next;
        while (end < plan_.tokens.size() && plan_.tokens[end] < c1) ++end;
        const int32_t* block = plan_.tokens.data() + next;
        const int64_t nb = static_cast<int64_t>(end - next);
        // In the cache's memory (on a device, the host needs x, rm, z, the ordinals and the
        // latents after).
        const size_t n = static_cast<size_t>(nb);
        float* const ref_x = must_get(enc_ref_x_.ops(ref_pos.size() * d));
        float* const x = must_get(enc_x_.ops(n * d));
        float* const rm = must_get(enc_rm_.ops(n * d));
        float* const z = must_get(enc_z_.ops(n * profile_.m));
        uint16_t* const chosen = must_get(enc_refs_.ops(n * kk));
        load_rows(ref_pos.data(), ref_pos.size(), ref_x);
        load_rows(block, n, x);
        // A token's candidates: the references at or before it (ref_pos is sorted).
        std::vector<int32_t> n_cand(static_cast<size_t>(nb));
        for (int64_t i = 0; i < nb; ++i) {
            n_cand[i] = static_cast<int32_t>(
                std::upper_bound(ref_pos.begin(), ref_pos.end(), block[i]) - ref_pos.begin());
        }
        const size_t at_lat = lat.size();
        lat.resize(at_lat + n * lb);
        k::LatentEncodeInputs in;
        in.w = &(*enc_)[sparse_layers_[s]];
        in.ref_x = ref_x;
        in.n_refs = static_cast<int64_t>(ref_pos.size());
        in.n_cand = n_cand.data();
        in.k = kk;
        k::LatentEncodeOutputs out;
        out.refs = chosen;
        out.rm = rm;
        out.z = z;
        out.latents = device_ != nullptr ? must_get(enc_latents_.ops(n * lb)) : lat.data() + at_lat;
        out.stride = lb;
        out.int4 = options_.latent_bits == 4;
        must(backend_->deltakv_encode(in, x, nb, out, exec()));
        if (device_ != nullptr && n > 0) {
            must(device_->copy_out(lat.data() + at_lat, out.latents, n * lb, k::Exec{}));
            for (auto* a : {&enc_x_, &enc_rm_}) must(a->pull(n * d));
            must(enc_z_.pull(n * profile_.m));
            must(enc_refs_.pull(n * kk));
        }
        refs.insert(refs.end(), enc_refs_.host.begin(), enc_refs_.host.begin() + n * kk);
        add_errors(s, block, enc_x_.host.data(), enc_rm_.host.data(), enc_z_.host.data(),
                   lat.data() + at_lat, nb);
        next = end;
    }
    // Scratch as large as the region's references: not kept between compressions.
    for (auto* a : {&enc_ref_x_, &enc_x_, &enc_rm_, &enc_z_}) a->release();
    enc_refs_.release();
    enc_latents_.release();
    // The last judge: their errors are in, and no layer's plan rows were shipped yet
    // (rows_final_end). Layers compress in order, so the later ones compress after.
    if (s + 1 == exact_judges() && plan_.decided(exact_judges())) keep_worst_exact();
}

void DeltaKvSequenceCache::finish_compression() {
    if (plan_.blocks.empty()) {
        plan_.active = false;
        return;
    }
    // Every layer's latents first (ops that may fail: the region is untouched until all are
    // made), then into the region.
    for (size_t sl = 0; sl < sparse_layers_.size(); ++sl) {
        if (!plan_.done[sl]) compress_layer(static_cast<int32_t>(sl));
    }
    for (size_t sl = 0; sl < sparse_layers_.size(); ++sl) {
        region_.latents[sl].insert(region_.latents[sl].end(), plan_.latents[sl].begin(),
                                   plan_.latents[sl].end());
        region_.refs[sl].insert(region_.refs[sl].end(), plan_.refs[sl].begin(),
                                plan_.refs[sl].end());
        region_.errors[sl].insert(region_.errors[sl].end(), plan_.errors[sl].begin(),
                                  plan_.errors[sl].end());
        plan_.latents[sl].clear();
        plan_.refs[sl].clear();
        plan_.errors[sl].clear();
    }
    std::vector<int32_t> freed;
    int32_t next_latent = static_cast<int32_t>(region_.latents[0].size() / latent_bytes()) -
                          static_cast<int32_t>(plan_.tokens.size());
    for (int32_t p : plan_.tokens) {
        freed.push_back(sparse_slot_[p]);
        sparse_slot_[p] = -1;
        region_.latent_of[p] = next_latent++;
    }
    sparse_pool_->release(freed);
    region_.end = plan_.end;
    plan_.active = false;
    plan_.blocks.clear();
    plan_.tokens.clear();
    compact();
}

}  // namespace deltaserve::kvstore
