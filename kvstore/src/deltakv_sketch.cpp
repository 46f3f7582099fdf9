// A scorer layer's first pass in a decode step (DeltaKvOptions::score_dims): every latent
// token of the region scored with its keys in a few RoPE pairs only, those where the step's
// queries put the most weight (SparQ scores with the largest query components the same way).
// A pair's two key dimensions come from two decoder rows, their references' mean and the
// pair's rotation: a quarter of the pairs costs about a quarter of making the whole keys.
#include <algorithm>
#include <cmath>
#include <limits>

#include "deltakv_scratch.h"
#include "deltaserve/kvstore/deltakv_cache.h"

namespace deltaserve::kvstore {

namespace k = deltaserve::kernels;

void DeltaKvSequenceCache::sketch_pick(int32_t layer, const kernels::AttentionShape& shape,
                                       const float* q) {
    const int32_t sl = layer_index_[layer];
    const int32_t hd = options_.head_dim, half = hd / 2, kv_dim = profile_.d / 2, kk = options_.k;
    const int32_t n_kv = options_.n_kv_heads, group = shape.n_heads / n_kv;
    const bool interleaved = options_.rope_style == k::RopeStyle::kInterleaved;
    const int32_t pairs =
        std::clamp(static_cast<int32_t>(std::lround(options_.score_dims * half)), 1, half);
    const auto dim_a = [&](int32_t j) { return interleaved ? 2 * j : j; };
    const auto dim_b = [&](int32_t j) { return interleaved ? 2 * j + 1 : j + half; };

    // Per KV head, the pairs where its query heads are largest (sum of squares), in order.
    sketch_pair_.clear();
    sketch_rows_.clear();
    std::vector<std::pair<float, int32_t>>& weight = sketch_weight_;
    weight.resize(static_cast<size_t>(half));
    for (int32_t g = 0; g < n_kv; ++g) {
        for (int32_t j = 0; j < half; ++j) {
            float w = 0.0f;
            for (int32_t h = g * group; h < (g + 1) * group; ++h) {
                const float* qh = q + static_cast<size_t>(h) * hd;
                w += qh[dim_a(j)] * qh[dim_a(j)] + qh[dim_b(j)] * qh[dim_b(j)];
            }
            weight[j] = {-w, j};
        }
        std::partial_sort(weight.begin(), weight.begin() + pairs, weight.end());
        std::sort(weight.begin(), weight.begin() + pairs,
                  [](const auto& a, const auto& b) { return a.second < b.second; });
        for (int32_t t = 0; t < pairs; ++t) sketch_pair_.push_back(weight[t].second);
    }
    // Rows: every kept pair's first dimension (KV head by KV head), then every second one.
    const int32_t n_pairs = n_kv * pairs, rows = 2 * n_pairs;
    for (int32_t p = 0; p < n_pairs; ++p)
        sketch_rows_.push_back(p / pairs * hd + dim_a(sketch_pair_[p]));
    for (int32_t p = 0; p < n_pairs; ++p)
        sketch_rows_.push_back(p / pairs * hd + dim_b(sketch_pair_[p]));
    k::int4_decoder_rows(profile_.int4_k[layer], sketch_rows_.data(), rows, sketch_dec_);

    // The references' keys (de-RoPEd) in those dimensions.
    gather_refs(sl, latent_sel_, kv_dim);
    must(ref_x_.pull(ref_pos_.size() * kv_dim));
    sketch_ref_.resize(ref_pos_.size() * static_cast<size_t>(rows));
    for (size_t r = 0; r < ref_pos_.size(); ++r) {
        const float* x = ref_x_.host.data() + r * kv_dim;
        for (int32_t c = 0; c < rows; ++c) sketch_ref_[r * rows + c] = x[sketch_rows_[c]];
    }

    // Each head's query in its KV head's kept pairs: first dimensions, then second ones.
    std::vector<float>& qs = sketch_q_;
    qs.resize(static_cast<size_t>(shape.n_heads) * 2 * pairs);
    for (int32_t h = 0; h < shape.n_heads; ++h) {
        const float* qh = q + static_cast<size_t>(h) * hd;
        float* o = qs.data() + static_cast<size_t>(h) * 2 * pairs;
        for (int32_t t = 0; t < pairs; ++t) {
            const int32_t j = sketch_pair_[h / group * pairs + t];
            o[t] = qh[dim_a(j)];
            o[pairs + t] = qh[dim_b(j)];
        }
    }
    // The kept pairs' RoPE angles of the distances 0 .. kNear - 1 (cos, then sin): a token
    // near the first of its block turns by the first's angles and its distance's, both in
    // L1. (The region's own angle rows, a quarter kilobyte per token, would come from
    // memory once per scorer.)
    constexpr int32_t kNear = 64;
    if (near_angles_.empty()) {  // every pair's, once
        near_angles_.resize(static_cast<size_t>(kNear) * hd);
        for (int32_t d = 0; d < kNear; ++d) {
            float* a = near_angles_.data() + static_cast<size_t>(d) * hd;
            k::rope_angles(d, hd, options_.rope_theta, a, a + half);
        }
    }
    sketch_near_.resize(static_cast<size_t>(kNear) * 2 * n_pairs);
    for (int32_t d = 0; d < kNear; ++d) {
        const float* angle = near_angles_.data() + static_cast<size_t>(d) * hd;
        float* o = sketch_near_.data() + static_cast<size_t>(d) * 2 * n_pairs;
        for (int32_t p = 0; p < n_pairs; ++p) {
            o[p] = angle[sketch_pair_[p]];
            o[n_pairs + p] = angle[half + sketch_pair_[p]];
        }
    }

    const int64_t n = static_cast<int64_t>(latent_sel_.size());
    top_score_.resize(static_cast<size_t>(n));
    constexpr int64_t kBlock = 16;
    threads_->parallel_for(n, kBlock, [&](int64_t b_all, int64_t e_all) {
        thread_local std::vector<float> block, turn;
        block.resize(static_cast<size_t>(kBlock) * rows);
        turn.resize(static_cast<size_t>(4) * n_pairs);
        float* first_c = turn.data();
        float* first_s = first_c + n_pairs;
        float* cos = first_s + n_pairs;
        float* sin = cos + n_pairs;
        for (int64_t b = b_all; b < e_all; b += kBlock) {
            const int64_t e = std::min(e_all, b + kBlock);
            k::deltakv_decode_int4(sketch_dec_, latent_ptrs_.data() + b, e - b, block.data(), rows);
            const int32_t p0 = latent_sel_[b];
            const float* first = angle_table_.data() + angle_of_[p0];
            for (int32_t p = 0; p < n_pairs; ++p) {
                first_c[p] = first[sketch_pair_[p]];
                first_s[p] = first[half + sketch_pair_[p]];
            }
            for (int64_t i = b; i < e; ++i) {
                const int32_t pos = latent_sel_[i];
                float* xa = block.data() + (i - b) * rows;
                float* xb = xa + n_pairs;
                const uint16_t* refs =
                    region_.refs[sl].data() + static_cast<size_t>(region_.latent_of[pos]) * kk;
                const float* rx[16];
                int32_t nr = 0;
                for (int32_t r = 0; r < kk; ++r) {
                    if (refs[r] == kNoRef) continue;
                    rx[nr++] = sketch_ref_.data() + static_cast<size_t>(refs[r]) * rows;
                }
                k::add_mean_rows(xa, rx, nr, rows);
                if (pos >= p0 && pos - p0 < kNear) {  // (p0 + d) theta, from the two angles
                    const float* nc =
                        sketch_near_.data() + static_cast<size_t>(pos - p0) * 2 * n_pairs;
                    const float* ns = nc + n_pairs;
                    for (int32_t p = 0; p < n_pairs; ++p) {
                        cos[p] = first_c[p] * nc[p] - first_s[p] * ns[p];
                        sin[p] = first_s[p] * nc[p] + first_c[p] * ns[p];
                    }
                } else {
                    const float* own = angle_table_.data() + angle_of_[pos];
                    for (int32_t p = 0; p < n_pairs; ++p) {
                        cos[p] = own[sketch_pair_[p]];
                        sin[p] = own[half + sketch_pair_[p]];
                    }
                }
                for (int32_t p = 0; p < n_pairs; ++p) {  // RoPE at the token's position
                    const float a = xa[p] * cos[p] - xb[p] * sin[p];
                    xb[p] = xa[p] * sin[p] + xb[p] * cos[p];
                    xa[p] = a;
                }
                float best = -std::numeric_limits<float>::infinity();
                for (int32_t h = 0; h < shape.n_heads; ++h) {
                    const float* qa = qs.data() + static_cast<size_t>(h) * 2 * pairs;
                    const float* qb = qa + pairs;
                    const float* ka = xa + h / group * pairs;
                    const float* kb = xb + h / group * pairs;
                    float sc = 0.0f;
                    for (int32_t t = 0; t < pairs; ++t) sc += qa[t] * ka[t] + qb[t] * kb[t];
                    best = std::max(best, sc);
                }
                top_score_[i] = best;
            }
        }
    });
    pick_top();
}

}  // namespace deltaserve::kvstore
