// Which compressed tokens a call attends: the observation layers' scores and the lead's
// selection, the top of a scorer's scores, and what the next step follows.
#include "deltaserve/kvstore/deltakv_cache.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <numeric>
#include <utility>

#include "deltakv_scratch.h"

namespace deltaserve::kvstore {

namespace k = deltaserve::kernels;

namespace {

// idx (sorted offsets into the region [r0, r1)) joined with those of the sorted positions
// that fall in it.
void add_region_positions(std::vector<int32_t>& idx, const std::vector<int32_t>& positions,
                          int32_t r0, int32_t r1) {
    std::vector<int32_t> in, both;
    for (int32_t p : positions) {
        if (p >= r0 && p < r1) in.push_back(p - r0);
    }
    if (in.empty()) return;
    std::set_union(idx.begin(), idx.end(), in.begin(), in.end(), std::back_inserter(both));
    idx = std::move(both);
}

}  // namespace

Status DeltaKvSequenceCache::observe(int32_t layer, const kernels::AttentionShape& shape,
                                     const float* q, int64_t ldq, const float* /*hidden*/,
                                     int64_t /*ldh*/, int32_t n, ThreadPool& pool) {
    const CallThreads call(threads_, pool);
    try {
        observe_call(layer, shape, q, ldq, n);
    } catch (const OpFailure& f) {
        return f.status;
    }
    return Status();
}

void DeltaKvSequenceCache::observe_call(int32_t layer, const kernels::AttentionShape& shape,
                                        const float* q, int64_t ldq, int32_t n) {
    if (options_.is_window_layer(layer)) return;  // exact rows, no part in DeltaKV's choices
    // What this call's commit compresses is known from positions alone: each sparse layer
    // compresses its share here, once its rows are stored and attended, so a prefill node
    // can ship the layer while later layers compute.
    if (!plan_.active && !sparse_layers_.empty() && more_ == 0)
        plan_compression(n_tokens_ + n_reserved_);
    if (!options_.full_layer[layer]) {
        const int32_t sl = layer_index_[layer];
        if (!plan_.blocks.empty() && !plan_.done[sl]) compress_layer(sl);
        return;
    }
    if (!observes_[layer]) return;
    release_temp();
    std::fill(reconstructed_.begin(), reconstructed_.end(), 0);
    const int32_t r0 = options_.sinks, r1 = region_.end;
    if (r1 <= r0) return;
    const int32_t region = r1 - r0;
    // With scorer layers a single token's group takes the whole region: they choose.
    const int32_t want = n == 1
                             ? options_.score_every > 0
                                   ? region
                                   : static_cast<int32_t>(std::ceil(options_.select_ratio * region))
                         : options_.prefill_select > 0 ? std::min(options_.prefill_select, region)
                                                       : region;
    std::vector<int32_t> idx(static_cast<size_t>(region));
    std::iota(idx.begin(), idx.end(), 0);
    if (want < region) {
        // Score = max over heads of the mean (over this call's queries) of q . k, OmniKV-style,
        // with this full layer's keys (after RoPE).
        const int32_t li = layer_index_[layer];
        const int dim = shape.head_dim;
        // A single query is its own mean (the same bits: 0 + q / 1), already where the op
        // reads it; a chunk's mean is made on the host and goes over.
        const float* query = q;
        if (n > 1) {
            const size_t width = static_cast<size_t>(shape.n_heads) * dim;
            int64_t ldh = ldq;
            const float* qh = host_q(shape, q, ldq, n, &ldh);
            std::vector<float>& qmean = sel_q_.host;
            qmean.assign(width, 0.0f);
            for (int32_t i = 0; i < n; ++i) {
                for (size_t j = 0; j < width; ++j)
                    qmean[j] += qh[i * ldh + j] / static_cast<float>(n);
            }
            must(sel_q_.push(width));
            query = sel_q_.data();
        }
        k::PoolKeys keys;
        keys.k = full_pool_->k_base(li);
        keys.row_stride = full_pool_->row_bytes();
        keys.slots = full_slot_.data() + r0;
        keys.n = region;
        float* const scores = must_get(sel_scores_.ops(static_cast<size_t>(region)));
        must(backend_->max_head_scores(shape, query, keys, scores, exec()));
        must(sel_scores_.pull(static_cast<size_t>(region)));
        const std::vector<float>& score = sel_scores_.host;
        std::nth_element(idx.begin(), idx.begin() + want, idx.end(), [&](int32_t a, int32_t b) {
            return score[a] != score[b] ? score[a] > score[b] : a > b;
        });
        idx.resize(static_cast<size_t>(want));
        std::sort(idx.begin(), idx.end());
    }
    if (n == 1 && want < region) {
        // Besides the step's pick: the last chunk's pins, and what the previous step read most
        // with the tokens after it.
        add_region_positions(idx, hints_.pins(), r0, r1);
        add_region_positions(idx, hints_.follow(), r0, r1);
    }
    if (n == 1 && layer == first_observation_) {
        last_select_ = idx;
        last_select_end_ = r1;
    }
    take_selection(idx, n);
}

std::vector<int32_t> DeltaKvSequenceCache::lead_selection() {
    const int32_t r0 = options_.sinks, region = std::max(0, region_.end - r0);
    std::vector<int32_t> idx;
    if (n_reserved_ == 1 && options_.score_every == 0 && last_select_end_ > r0 &&
        last_select_end_ <= region_.end) {
        // A decode step: the previous step's selection, and what was compressed since.
        idx = last_select_;
        for (int32_t t = last_select_end_ - r0; t < region; ++t) idx.push_back(t);
    } else {
        idx.resize(static_cast<size_t>(region));
        std::iota(idx.begin(), idx.end(), 0);
    }
    last_select_end_ = 0;
    return idx;
}

void DeltaKvSequenceCache::take_selection(const std::vector<int32_t>& idx, int32_t n) {
    const int32_t r0 = options_.sinks;
    // A single token attends the latent ones through attend(); a chunk, whose many queries
    // would each weigh every latent, gets them reconstructed, a layer at a time (reconstruct).
    for (int32_t t : idx) {
        const int32_t pos = r0 + t;
        if (sparse_slot_[pos] < 0) {
            (n == 1 ? latent_sel_ : recon_pos_).push_back(pos);
            continue;
        }
        selected_.push_back(pos);
        selected_slot_.push_back(sparse_slot_[pos]);
    }
}

void DeltaKvSequenceCache::pick_top() {
    const int64_t n = static_cast<int64_t>(latent_sel_.size());
    const int64_t want =
        std::min<int64_t>(n, static_cast<int64_t>(std::ceil(options_.select_ratio * n)));
    top_.resize(static_cast<size_t>(n));
    std::iota(top_.begin(), top_.end(), 0);
    std::nth_element(top_.begin(), top_.begin() + want, top_.end(), [&](int32_t a, int32_t b) {
        return top_score_[a] != top_score_[b] ? top_score_[a] > top_score_[b] : a > b;
    });
    top_.resize(static_cast<size_t>(want));
    std::sort(top_.begin(), top_.end());
    scored_.clear();
    for (int32_t i : top_) scored_.push_back(latent_sel_[i]);
}

void DeltaKvSequenceCache::keep_top_scored(int n_heads) {
    const int64_t n = static_cast<int64_t>(latent_sel_.size());
    const int32_t stride = k::int4_code_stride(profile_.m);
    const bool int4 = options_.latent_bits == 4;
    must(scores_.pull(static_cast<size_t>(n_heads) * n));
    if (int4) must(codes_.pull(static_cast<size_t>(n) * stride));
    std::vector<float>& scores = scores_.host;
    std::vector<uint8_t>& codes = codes_.host;
    top_score_.assign(scores.begin(), scores.begin() + n);
    for (int h = 1; h < n_heads; ++h) {
        const float* sh = scores.data() + static_cast<size_t>(h) * n;
        for (int64_t i = 0; i < n; ++i) top_score_[i] = std::max(top_score_[i], sh[i]);
    }
    pick_top();
    const int64_t want = static_cast<int64_t>(top_.size());
    // The pick's scores, latents and references to the front, in place: top_[j] >= j, so
    // nothing is overwritten before it is read.
    for (int h = 0; h < n_heads; ++h) {
        for (int64_t j = 0; j < want; ++j) scores[h * want + j] = scores[h * n + top_[j]];
    }
    for (int64_t j = 0; j < want; ++j) {
        latent_ptrs_[j] = latent_ptrs_[top_[j]];
        lat_rows_[j] = lat_rows_[top_[j]];
        if (int4 && top_[j] != j) {
            std::copy_n(codes.begin() + static_cast<int64_t>(top_[j]) * stride, stride,
                        codes.begin() + j * stride);
        }
    }
    must(scores_.push(static_cast<size_t>(n_heads) * want));
    if (int4) must(codes_.push(static_cast<size_t>(want) * stride));
}

void DeltaKvSequenceCache::score_follow(int n_heads, const std::vector<int32_t>& positions) {
    const size_t nt = positions.size();
    const size_t end = static_cast<size_t>(n_tokens_ + n_reserved_);
    // A score's share of the head's attention, with the logit correction it was given, as
    // its log: the order is the weights' order, without an exp per score.
    follow_best_.resize(nt);
    for (int h = 0; h < n_heads; ++h) {
        const float shift = lse_b_.host[h] - lse_b_raw_[h] - lse_a_.host[h];
        const float* sh = scores_.host.data() + static_cast<size_t>(h) * nt;
        float* best = follow_best_.data();
        if (h == 0) {
            for (size_t j = 0; j < nt; ++j) best[j] = sh[j] + shift;
        } else {
            for (size_t j = 0; j < nt; ++j) best[j] = std::max(best[j], sh[j] + shift);
        }
    }
    hints_.add_follow(positions, follow_best_.data(), end);
}

}  // namespace deltaserve::kvstore
