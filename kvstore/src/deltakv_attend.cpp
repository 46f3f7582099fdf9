// Attention over compressed tokens: their references gathered, a chunk's selection
// reconstructed, a decode step's latent keys scored and attended through the latents, the
// logit correction, and the pins a chunk's last queries leave.
#include "deltaserve/kvstore/deltakv_cache.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "deltakv_scratch.h"
#include "deltaserve/kernels/matmul.h"
#include "row_io.h"

namespace deltaserve::kvstore {

namespace k = deltaserve::kernels;

k::RopeAngles DeltaKvSequenceCache::rope_angles(const int32_t* at) const {
    k::RopeAngles a;
    a.table = device_ != nullptr ? angles_on_.data() : angle_table_.data();
    a.at = at;
    a.n_heads = options_.n_kv_heads;
    a.head_dim = options_.head_dim;
    a.style = options_.rope_style;
    return a;
}

void DeltaKvSequenceCache::sync_mirrors(int32_t sl) {
    if (device_ == nullptr) return;
    must(angles_on_.sync(angle_table_.data(), angle_table_.size(), angles_synced_));
    if (sl < 0) return;
    must(latents_on_[sl].sync(region_.latents[sl].data(), region_.latents[sl].size(),
                              latents_synced_[sl]));
    must(refs_on_[sl].sync(region_.refs[sl].data(), region_.refs[sl].size(), refs_synced_[sl]));
}

void DeltaKvSequenceCache::forget_mirrors() {
    angles_synced_ = 0;
    std::fill(latents_synced_.begin(), latents_synced_.end(), 0);
    std::fill(refs_synced_.begin(), refs_synced_.end(), 0);
}

const float* DeltaKvSequenceCache::host_q(const k::AttentionShape& shape, const float* q,
                                          int64_t ldq, int32_t n, int64_t* ld) {
    *ld = ldq;
    if (device_ == nullptr) return q;
    const int64_t width = static_cast<int64_t>(shape.n_heads) * shape.head_dim;
    q_host_.resize(static_cast<size_t>(n * width));
    // Packed rows (the forward pass's) come over in one copy.
    const int32_t copies = ldq == width ? 1 : n;
    const int64_t rows = ldq == width ? n : 1;
    for (int32_t i = 0; i < copies; ++i) {
        must(device_->copy_out(q_host_.data() + i * width, q + i * ldq,
                               static_cast<size_t>(rows * width) * sizeof(float), k::Exec{}));
    }
    *ld = width;
    return q_host_.data();
}

k::LatentRows DeltaKvSequenceCache::latent_rows(int32_t sl) const {
    k::LatentRows lat;
    lat.n = static_cast<int64_t>(lat_rows_.size());
    lat.rows = lat_rows_.data();
    lat.latents = device_ != nullptr ? latents_on_[sl].data() : region_.latents[sl].data();
    lat.stride = latent_bytes();
    lat.m = profile_.m;
    lat.refs = device_ != nullptr ? refs_on_[sl].data() : region_.refs[sl].data();
    lat.k = options_.k;
    lat.int4 = options_.latent_bits == 4;
    return lat;
}

void DeltaKvSequenceCache::gather_refs(int32_t sl, const std::vector<int32_t>& positions,
                                       int32_t dims) {
    const int32_t d = profile_.d, kv_dim = d / 2;
    const size_t lb = latent_bytes();
    latent_ptrs_.clear();
    lat_rows_.clear();
    lat_at_.clear();
    for (int32_t p : positions) {
        lat_rows_.push_back(region_.latent_of[p]);
        latent_ptrs_.push_back(region_.latents[sl].data() +
                               static_cast<size_t>(lat_rows_.back()) * lb);
        lat_at_.push_back(angles(p));
    }
    // Every reference the region's latents may name, a row per ordinal (the sinks, then the
    // region's references): a selection's tokens name nearly all of them, and a token's
    // rows are then found without a lookup.
    ref_pos_.clear();
    if (!positions.empty()) {
        for (int32_t p = 0; p < options_.sinks; ++p) ref_pos_.push_back(p);
        for (int32_t p : region_.ref_list) {
            if (p >= region_.end) break;
            ref_pos_.push_back(p);
        }
    }
    ref_slots_.resize(ref_pos_.size());
    ref_at_.resize(ref_pos_.size());
    for (size_t i = 0; i < ref_pos_.size(); ++i) {
        ref_slots_[i] = sparse_slot_[ref_pos_[i]];
        ref_at_[i] = angles(ref_pos_[i]);
    }
    sync_mirrors(sl);
    float* ref_x = must_get(ref_x_.ops(ref_pos_.size() * dims));
    k::PoolRows rows;
    rows.k = sparse_pool_->k_base(sl);
    rows.v = dims == d ? sparse_pool_->v_base(sl) : nullptr;
    rows.row_stride = sparse_pool_->row_bytes();
    rows.slots = ref_slots_.data();
    rows.n = static_cast<int64_t>(ref_pos_.size());
    rows.width = kv_dim;
    rows.angles = rope_angles(ref_at_.data());
    must(backend_->deltakv_pool_rows(rows, ref_x, exec()));
}

void DeltaKvSequenceCache::reconstruct(int32_t layer) {
    reconstructed_[layer] = 1;
    if (recon_pos_.empty()) return;
    const int32_t sl = layer_index_[layer];
    const int32_t d = profile_.d, m = profile_.m, kv_dim = d / 2, half = options_.head_dim / 2;
    // The references' x (de-RoPEd once) and the RoPE angles of every position involved
    // (shared by the group's layers).
    gather_refs(sl, recon_pos_, d);
    const int64_t n = static_cast<int64_t>(recon_pos_.size());
    const size_t row = static_cast<size_t>(kv_dim) * sizeof(uint16_t);
    uint8_t* const rk = must_get(recon_k_.ops(static_cast<size_t>(n) * row));
    uint8_t* const rv = must_get(recon_v_.ops(static_cast<size_t>(n) * row));
    if (recon_slots_.size() < static_cast<size_t>(n)) {
        recon_slots_.resize(static_cast<size_t>(n));
        std::iota(recon_slots_.begin(), recon_slots_.end(), 0);
    }
    if (options_.latent_bits == 4) {  // the backend's: a token's row made and written at once
        k::LatentDecodeInputs in;
        in.dec = (*dec_)[layer];
        in.ref_x = ref_x_.data();
        in.n_refs = static_cast<int64_t>(ref_pos_.size());
        in.angles = rope_angles(lat_at_.data());
        must(backend_->deltakv_reconstruct(kv_shape(), latent_rows(sl), in, rk, rv, row, exec()));
        return;
    }
    // fp16 latents: Dec(z) for every token at once, then x += the mean of the references,
    // RoPE on K, into the token's row of this layer's reconstructions.
    grow(x_, static_cast<size_t>(n) * d);
    grow(z_, static_cast<size_t>(n) * m);
    for (int64_t i = 0; i < n; ++i)
        read_kv_row(k::DType::kF16, latent_ptrs_[i], z_.data() + i * m, m);
    k::matmul(profile_.layers[layer].wd, z_.data(), m, n, x_.data(), d, *threads_);
    threads_->parallel_for(n, 16, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
            float* xi = x_.data() + i * d;
            add_ref_mean(sl, recon_pos_[i], d, xi, nullptr);
            const float* a = angle_table_.data() + lat_at_[i];
            k::rope_apply(xi, options_.n_kv_heads, options_.head_dim, a, a + half,
                          options_.rope_style, false);
            write_kv_row(k::DType::kF16, rk + i * row, xi, kv_dim);
            write_kv_row(k::DType::kF16, rv + i * row, xi + kv_dim, kv_dim);
        }
    });
}

Status DeltaKvSequenceCache::attended_rows(int32_t layer, std::span<const int32_t> positions,
                                           float* out, uint8_t* latent) {
    try {
        attended_rows_call(layer, positions, out, latent);
    } catch (const OpFailure& f) {
        return f.status;
    }
    return Status();
}

void DeltaKvSequenceCache::attended_rows_call(int32_t layer, std::span<const int32_t> positions,
                                              float* out, uint8_t* latent) {
    const int32_t d = profile_.d, m = profile_.m, kv_dim = d / 2;
    const int32_t li = layer_index_[layer];
    const bool full = options_.full_layer[layer], window = options_.is_window_layer(layer);
    std::vector<int32_t> lat;
    std::vector<size_t> lat_at;
    const SlotPool& pool = window ? *window_pool_ : full ? *full_pool_ : *sparse_pool_;
    const std::vector<int32_t>& slot_of = window ? window_slot_ : full ? full_slot_ : sparse_slot_;
    const float theta = window && options_.window_rope_theta > 0.0f ? options_.window_rope_theta
                                                                    : options_.rope_theta;
    std::vector<uint8_t> kv(2 * pool.row_bytes());
    for (size_t i = 0; i < positions.size(); ++i) {
        const int32_t pos = positions[i];
        float* x = out + i * static_cast<size_t>(d);
        if (window && slot_of[pos] < 0) {  // past the window: not held
            latent[i] = 2;
            std::fill(x, x + d, 0.0f);
            continue;
        }
        latent[i] = !full && !window && sparse_slot_[pos] < 0;
        if (latent[i]) {
            lat.push_back(pos);
            lat_at.push_back(i);
            continue;
        }
        const int32_t slot = slot_of[pos];
        must(pool.read_rows(li, std::span<const int32_t>(&slot, 1), kv.data()));
        read_kv_row(k::DType::kF16, kv.data(), x, kv_dim);
        read_kv_row(k::DType::kF16, kv.data() + pool.row_bytes(), x + kv_dim, kv_dim);
        k::rope_inverse(x, options_.n_kv_heads, options_.head_dim, pos, theta, options_.rope_style);
    }
    if (lat.empty()) return;
    gather_refs(li, lat, d);
    must(ref_x_.pull(ref_pos_.size() * d));
    std::vector<float> z(static_cast<size_t>(m));
    for (size_t j = 0; j < lat.size(); ++j) {
        float* x = out + lat_at[j] * static_cast<size_t>(d);
        if (options_.latent_bits == 4) {
            k::deltakv_decode_int4(profile_.int4[layer], latent_ptrs_.data() + j, 1, x, d);
        } else {
            read_kv_row(k::DType::kF16, latent_ptrs_[j], z.data(), m);
            k::matmul(profile_.layers[layer].wd, z.data(), m, 1, x, d, *threads_);
        }
        add_ref_mean(li, lat[j], d, x, nullptr);
    }
}

void DeltaKvSequenceCache::add_ref_mean(int32_t sl, int32_t pos, int32_t dims, float* x,
                                        int32_t* rows) const {
    const int32_t kk = options_.k;
    const uint16_t* refs =
        region_.refs[sl].data() + static_cast<size_t>(region_.latent_of[pos]) * kk;
    const float* rx[16];
    int32_t nr = 0;
    for (int32_t q = 0; q < kk; ++q) {
        const int32_t row = refs[q] != kNoRef ? refs[q] : -1;
        if (rows != nullptr) rows[q] = row;
        if (row >= 0) rx[nr++] = ref_x_.host.data() + static_cast<size_t>(row) * dims;
    }
    k::add_mean_rows(x, rx, nr, dims);
}

void DeltaKvSequenceCache::latent_scores(int32_t layer, const kernels::AttentionShape& shape,
                                         const float* q, const std::vector<int32_t>& positions) {
    const int32_t sl = layer_index_[layer];
    const int32_t m = profile_.m, kv_dim = profile_.d / 2, half = options_.head_dim / 2;
    gather_refs(sl, positions, kv_dim);
    const int64_t n = static_cast<int64_t>(positions.size());
    float* const scores = must_get(scores_.ops(static_cast<size_t>(shape.n_heads) * n));
    if (options_.latent_bits == 4) {  // the backend's: keys made and scored in one pass
        uint8_t* const codes =
            must_get(codes_.ops(static_cast<size_t>(n) * k::int4_code_stride(m)));
        k::LatentDecodeInputs in;
        in.dec = (*dec_k_)[layer];
        in.ref_x = ref_x_.data();
        in.n_refs = static_cast<int64_t>(ref_pos_.size());
        in.angles = rope_angles(lat_at_.data());
        must(backend_->deltakv_key_scores(shape, latent_rows(sl), in, q, scores, n, codes, exec()));
        return;
    }
    // fp16 latents: the decoder's K rows for every token at once, then a block at a time
    // while its rows are in cache: the mean of the references' K, RoPE, every head's score.
    grow(z_, static_cast<size_t>(n) * m);
    grow(x_, static_cast<size_t>(n) * kv_dim);
    for (int64_t i = 0; i < n; ++i)
        read_kv_row(k::DType::kF16, latent_ptrs_[i], z_.data() + i * m, m);
    k::WeightMatrix wk = profile_.layers[layer].wd;
    wk.rows = kv_dim;
    k::matmul(wk, z_.data(), m, n, x_.data(), kv_dim, *threads_);
    constexpr int64_t kBlock = 16;
    threads_->parallel_for_affine(n, kBlock, [&](int64_t b_all, int64_t e_all) {
        for (int64_t b = b_all; b < e_all; b += kBlock) {
            const int64_t e = std::min(e_all, b + kBlock);
            float* rows = x_.data() + b * kv_dim;
            for (int64_t i = b; i < e; ++i) {
                float* xi = rows + (i - b) * kv_dim;
                add_ref_mean(sl, positions[i], kv_dim, xi, nullptr);
                const float* a = angle_table_.data() + lat_at_[i];
                k::rope_apply(xi, options_.n_kv_heads, options_.head_dim, a, a + half,
                              options_.rope_style, false);
            }
            k::head_scores(shape, q, rows, kv_dim, e - b, scores + b, n);
        }
    });
}

Result<bool> DeltaKvSequenceCache::attend(int32_t layer, const kernels::AttentionShape& shape,
                                          const float* q, int64_t ldq, int32_t n, float* out,
                                          int64_t ldo, ThreadPool& pool) {
    const CallThreads call(threads_, pool);
    try {
        return attend_call(layer, shape, q, ldq, n, out, ldo);
    } catch (const OpFailure& f) {
        return f.status;
    }
}

bool DeltaKvSequenceCache::attend_call(int32_t layer, const kernels::AttentionShape& shape,
                                       const float* q, int64_t ldq, int32_t n, float* out,
                                       int64_t ldo) {
    if (options_.is_window_layer(layer)) return false;  // exact rows: the view is all of it
    if (n > 1) return attend_chunk(layer, shape, q, ldq, n, out, ldo);
    if (options_.full_layer[layer] || latent_sel_.empty()) return false;
    DS_CHECK(n == 1, "latent tokens are selected for single-token calls only");
    const size_t heads = static_cast<size_t>(shape.n_heads);
    float* const lse_a = must_get(lse_a_.ops(heads));
    float* const lse_b = must_get(lse_b_.ops(heads));
    float* const out_b = must_get(out_b_.ops(heads * shape.head_dim));
    must(backend_->attention_lse(shape, view(layer, 1), q, ldq, 1, out, ldo, lse_a,
                                 /*causal=*/true, exec()));
    // A scorer scores every latent token of the region, then attends its pick as the layers
    // after it do.
    const bool picks = options_.score_every > 0 && scorer_[layer];
    DS_CHECK(options_.score_every == 0 || picks || !scored_.empty(),
             "a sparse layer before its scorer");
    const std::vector<int32_t>& positions =
        options_.score_every == 0 || picks ? latent_sel_ : scored_;
    int64_t ldh = ldq;
    const bool corrected = corrects(layer);
    const float* qh = corrected || picks ? host_q(shape, q, ldq, 1, &ldh) : nullptr;
    if (picks && options_.score_dims < 1.0f && options_.latent_bits == 4) {
        sketch_pick(layer, shape, qh);
        latent_scores(layer, shape, q, scored_);
    } else {
        latent_scores(layer, shape, q, positions);
        if (picks) keep_top_scored(shape.n_heads);
    }
    attended_latents_ = static_cast<int32_t>(picks ? scored_.size() : positions.size());
    k::LatentValueInputs in;
    if (options_.latent_bits == 4) in.codes = codes_.data();
    in.wd_v = on_->wd_v[layer];
    in.ref_v = sparse_pool_->v_base(layer_index_[layer]);
    in.ref_stride = sparse_pool_->row_bytes();
    in.ref_slots = ref_slots_.data();
    in.n_refs = static_cast<int64_t>(ref_slots_.size());
    k::LatentRows lat = latent_rows(layer_index_[layer]);
    lat.n = attended_latents_;
    must(backend_->latent_attention(shape, lat, scores_.data(), in, out_b, lse_b, exec()));
    // Following reads the weights (host code); with the correction, the lse goes over and back.
    const bool follows = options_.follow > 0 && options_.score_every == 0;
    if (follows || corrected) must(lse_b_.pull(heads));
    if (options_.follow > 0) lse_b_raw_ = lse_b_.host;
    if (corrected) {
        add_logit_correction(layer, shape, qh, ldh, 1, lse_b_.host.data());
        must(lse_b_.push(heads));
    }
    must(backend_->merge_attention(out, lse_a, out_b, lse_b_.data(), shape.n_heads, shape.head_dim,
                                   exec()));
    // With scorers a step's layers attend different picks: not followed.
    if (follows) {
        must(lse_a_.pull(heads));
        must(scores_.pull(heads * positions.size()));
        score_follow(shape.n_heads, positions);
    }
    return true;
}

bool DeltaKvSequenceCache::corrects(int32_t layer) const {
    return options_.logit_correction != 0.0f && !options_.full_layer[layer] &&
           !options_.is_window_layer(layer) &&
           static_cast<size_t>(layer) < profile_.key_error_var.size() &&
           !profile_.key_error_var[layer].empty();
}

void DeltaKvSequenceCache::add_logit_correction(int32_t layer, const kernels::AttentionShape& shape,
                                                const float* q, int64_t ldq, int32_t n,
                                                float* lse) const {
    if (!corrects(layer)) return;
    const int32_t hd = options_.head_dim, half = hd / 2, group = shape.n_heads / shape.n_kv_heads;
    const bool interleaved = options_.rope_style == k::RopeStyle::kInterleaved;
    const float c = options_.logit_correction * shape.scale * shape.scale * 0.5f;
    for (int32_t i = 0; i < n; ++i) {
        for (int h = 0; h < shape.n_heads; ++h) {
            const float* qh = q + i * ldq + static_cast<int64_t>(h) * hd;
            const float* var =
                profile_.key_error_var[layer].data() + static_cast<size_t>(h / group) * half;
            float b = 0.0f;
            for (int32_t t = 0; t < half; ++t) {
                // The two dimensions RoPE turns together share the pair's variance.
                const float q0 = interleaved ? qh[2 * t] : qh[t];
                const float q1 = interleaved ? qh[2 * t + 1] : qh[t + half];
                b += (q0 * q0 + q1 * q1) * var[t];
            }
            float& l = lse[static_cast<size_t>(i) * shape.n_heads + h];
            if (std::isfinite(l)) l += c * b;
        }
    }
}

bool DeltaKvSequenceCache::attend_chunk(int32_t layer, const kernels::AttentionShape& shape,
                                        const float* q, int64_t ldq, int32_t n, float* out,
                                        int64_t ldo) {
    if (options_.full_layer[layer] || options_.is_window_layer(layer)) return false;
    // What the commit compresses is known from positions alone; the last chunk of a prompt
    // scores its tokens for the pins while they are still exact.
    if (!plan_.active && more_ == 0) plan_compression(n_tokens_ + n_reserved_);
    const bool pins = options_.pin_ratio > 0.0f && more_ == 0;
    if (recon_pos_.empty() && !pins) return false;
    DS_CHECK(ldo == static_cast<int64_t>(shape.n_heads) * shape.head_dim,
             "chunk output rows must be packed");
    const size_t rows = static_cast<size_t>(n) * shape.n_heads;
    float* const lse_a = must_get(lse_a_.ops(rows));
    // view(): the sinks, the selection's references, the buffer and the new tokens; the
    // selection's reconstructed tokens are attended apart (every query sees all of them),
    // their lse corrected, and merged.
    must(backend_->attention_lse(shape, view(layer, n), q, ldq, n, out, ldo, lse_a,
                                 /*causal=*/true, exec()));
    const bool corrected = corrects(layer);
    int64_t ldh = ldq;
    const float* qh = corrected || pins ? host_q(shape, q, ldq, n, &ldh) : nullptr;
    if (!recon_pos_.empty()) {
        float* const lse_b = must_get(lse_b_.ops(rows));
        float* const out_b = must_get(out_b_.ops(rows * shape.head_dim));
        must(backend_->attention_lse(shape, reconstructed_view(), q, ldq, n, out_b, ldo, lse_b,
                                     /*causal=*/false, exec()));
        if (pins || corrected) must(lse_b_.pull(rows));
        if (pins) lse_b_raw_ = lse_b_.host;
        if (corrected) {
            add_logit_correction(layer, shape, qh, ldh, n, lse_b_.host.data());
            must(lse_b_.push(rows));
        }
        must(backend_->merge_attention(out, lse_a, out_b, lse_b_.data(), static_cast<int>(rows),
                                       shape.head_dim, exec()));
    }
    if (pins) {
        must(lse_a_.pull(rows));
        score_pins(layer, shape, qh, ldh, n);
    }
    return true;
}

void DeltaKvSequenceCache::score_pins(int32_t layer, const kernels::AttentionShape& shape,
                                      const float* q, int64_t ldq, int32_t n) {
    const int32_t sl = layer_index_[layer];
    const int32_t w = std::min(n, std::max(1, options_.pin_window));
    const int nh = shape.n_heads;
    const size_t end = static_cast<size_t>(n_tokens_ + n_reserved_);
    // A logit's share of its row's attention: less the row's log-sum-exp over every token
    // (lse_a_, merged), plus, for reconstructed tokens, the correction attention added to
    // their logits (lse_b_ after it less before it). Exact tokens have none.
    std::vector<float> shift_b(static_cast<size_t>(w) * nh), shift_x(shift_b.size());
    for (int32_t i = 0; i < w; ++i) {
        for (int h = 0; h < nh; ++h) {
            const size_t r = static_cast<size_t>(n - w + i) * nh + h;
            const size_t o = static_cast<size_t>(i) * nh + h;
            shift_x[o] = -lse_a_.host[r];
            if (!recon_pos_.empty()) shift_b[o] = lse_b_.host[r] - lse_b_raw_[r] - lse_a_.host[r];
        }
    }
    std::vector<const uint16_t*> rows;
    std::vector<float> mass;
    const auto score = [&](const std::vector<int32_t>& pos, const std::vector<float>& shift) {
        const int64_t nb = static_cast<int64_t>(pos.size());
        if (nb == 0) return;
        mass.assign(static_cast<size_t>(nh) * nb, 0.0f);
        k::attention_mass(q + static_cast<int64_t>(n - w) * ldq, ldq, w, shift.data(), nh,
                          shape.n_kv_heads, shape.head_dim, shape.scale, rows.data(), nb,
                          mass.data(), *threads_);
        hints_.add_pin_mass(pos, mass.data(), nh, end);
    };
    // The region's reconstructed tokens.
    const size_t row = sparse_pool_->row_bytes();
    must(recon_k_.pull(recon_pos_.size() * row));
    rows.resize(recon_pos_.size());
    for (size_t j = 0; j < recon_pos_.size(); ++j)
        rows[j] = reinterpret_cast<const uint16_t*>(recon_k_.host.data() + j * row);
    score(recon_pos_, shift_b);
    // Exact ones: the region's references a chunk attends (a reference is attended only when
    // a step's pick or the pins name it, as a latent token is) and the tokens this commit
    // compresses, still in the buffer.
    pin_pos_.assign(selected_.begin(), selected_.end());
    for (int32_t p = region_.end; plan_.active && p < plan_.end; ++p) pin_pos_.push_back(p);
    rows.resize(pin_pos_.size());
    if (device_ == nullptr) {
        for (size_t j = 0; j < pin_pos_.size(); ++j) {
            rows[j] = reinterpret_cast<const uint16_t*>(
                sparse_pool_->k_row(sl, sparse_slot_[pin_pos_[j]]));
        }
    } else {  // their K and V rows come over; the K rows are scored
        std::vector<int32_t> slots;
        for (int32_t p : pin_pos_) slots.push_back(sparse_slot_[p]);
        pin_rows_.resize(2 * slots.size() * row);
        must(sparse_pool_->read_rows(sl, slots, pin_rows_.data()));
        for (size_t j = 0; j < pin_pos_.size(); ++j)
            rows[j] = reinterpret_cast<const uint16_t*>(pin_rows_.data() + j * row);
    }
    score(pin_pos_, shift_x);
}

}  // namespace deltaserve::kvstore
