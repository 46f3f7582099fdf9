// The tokens a plan's latents reconstruct worst, kept exact (DeltaKvOptions::exact_share).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "deltaserve/common/status.h"
#include "deltaserve/kernels/deltakv.h"
#include "deltaserve/kvstore/deltakv_cache.h"

namespace deltaserve::kvstore {

namespace k = deltaserve::kernels;

void DeltaKvSequenceCache::add_errors(int32_t s, const int32_t* pos, const float* x,
                                      const float* rm, const float* z, const uint8_t* packed,
                                      int64_t nb) {
    const int32_t d = profile_.d, half = d / 2;
    const int32_t layer = sparse_layers_[s];
    // The judges' K and V errors of every token choose the tokens kept exact
    // (keep_worst_exact); elsewhere a sample (kErrorSample) is measured.
    const bool judge = options_.exact_share > 0.0f && s < exact_judges();
    auto& err = plan_.err[s];
    auto& codes = plan_.errors[s];
    const size_t at = err.size(), code_at = codes.size();
    if (judge) err.resize(at + 2 * static_cast<size_t>(nb));
    codes.resize(code_at + static_cast<size_t>(nb), 0);
    const size_t lb = latent_bytes();
    threads_->parallel_for(nb, 32, [&](int64_t b, int64_t e) {
        std::vector<int64_t> rows;
        std::vector<const uint8_t*> ptrs;
        for (int64_t i = b; i < e; ++i) {
            if (judge || pos[i] % kErrorSample == 0) {
                rows.push_back(i);
                ptrs.push_back(packed + i * lb);
            }
        }
        std::vector<float> out(rows.size() * static_cast<size_t>(d));
        // As a reconstruction gets it: int4 latents through the int8 decoder.
        if (options_.latent_bits == 4) {
            if (!rows.empty()) {
                k::deltakv_decode_int4(profile_.int4[layer], ptrs.data(),
                                       static_cast<int64_t>(rows.size()), out.data(), d);
            }
            for (size_t j = 0; j < rows.size(); ++j) {
                for (int32_t t = 0; t < d; ++t) out[j * d + t] += rm[rows[j] * d + t];
            }
        } else {
            for (size_t j = 0; j < rows.size(); ++j) {
                k::deltakv_decode(profile_.layers[layer], z + rows[j] * profile_.m,
                                  rm + rows[j] * d, out.data() + j * d);
            }
        }
        for (size_t j = 0; j < rows.size(); ++j) {
            const int64_t i = rows[j];
            double ek = 0.0, ev = 0.0, norm = 0.0;
            for (int32_t t = 0; t < d; ++t) {
                const double xt = x[i * d + t], diff = static_cast<double>(out[j * d + t]) - xt;
                (t < half ? ek : ev) += diff * diff;
                norm += xt * xt;
            }
            if (judge) {
                err[at + 2 * i] = static_cast<float>(ek);
                err[at + 2 * i + 1] = static_cast<float>(ev);
            }
            codes[code_at + i] = deltakv_error_code(norm > 0.0 ? (ek + ev) / norm : 0.0);
        }
    });
}

int32_t DeltaKvSequenceCache::exact_judges() const {
    const auto n = static_cast<int32_t>(sparse_layers_.size());
    return std::clamp(static_cast<int32_t>(std::ceil(options_.exact_depth * static_cast<float>(n))),
                      1, n);
}

bool DeltaKvSequenceCache::exact_pending() const {
    return options_.exact_share > 0.0f && plan_.active && !plan_.blocks.empty() &&
           !plan_.decided(exact_judges());
}

void DeltaKvSequenceCache::keep_worst_exact() {
    const size_t n = plan_.tokens.size();
    if (options_.exact_share <= 0.0f || n == 0) return;
    const size_t n_exact = plan_.exact_count(n, options_.exact_share);
    plan_.exact_carry += static_cast<double>(options_.exact_share) * static_cast<double>(n) -
                         static_cast<double>(n_exact);
    if (n_exact == 0) return;
    // A token's badness: per judging layer, its K error over the plan's mean K error, plus the
    // same for V.
    std::vector<double> bad(n, 0.0);
    for (int32_t s = 0; s < exact_judges(); ++s) {
        const auto& err = plan_.err[s];
        DS_CHECK(err.size() == 2 * n, "the errors cover the plan's tokens");
        for (int half = 0; half < 2; ++half) {
            double mean = 0.0;
            for (size_t i = 0; i < n; ++i) mean += err[2 * i + half];
            mean /= static_cast<double>(n);
            if (mean <= 0.0) continue;
            for (size_t i = 0; i < n; ++i) bad[i] += err[2 * i + half] / mean;
        }
    }
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), size_t{0});
    std::partial_sort(
        order.begin(), order.begin() + static_cast<int64_t>(n_exact), order.end(),
        [&](size_t a, size_t b) { return bad[a] > bad[b] || (bad[a] == bad[b] && a < b); });
    std::vector<uint8_t> exact(n, 0);
    for (size_t j = 0; j < n_exact; ++j) exact[order[j]] = 1;
    // The plan's latents name references by ordinal (the position order of every reference):
    // each new reference moves the ordinals of the references after it up by one.
    std::vector<int32_t> old_refs;
    for (int32_t p = 0; p < plan_.end; ++p) {
        if (region_.is_ref(p)) old_refs.push_back(p);
    }
    std::vector<uint16_t> renumber(old_refs.size());
    size_t added = 0, i = 0;
    for (size_t o = 0; o < old_refs.size(); ++o) {
        for (; i < n && plan_.tokens[i] < old_refs[o]; ++i) added += exact[i];
        renumber[o] = static_cast<uint16_t>(o + added);
    }
    const size_t lb = latent_bytes(), kk = static_cast<size_t>(options_.k);
    for (size_t sl = 0; sl < sparse_layers_.size(); ++sl) {
        if (!plan_.done[sl]) continue;  // compresses what is left
        auto& lat = plan_.latents[sl];
        auto& refs = plan_.refs[sl];
        auto& codes = plan_.errors[sl];
        size_t w = 0;
        for (size_t j = 0; j < n; ++j) {
            if (exact[j]) continue;
            std::copy_n(lat.begin() + static_cast<int64_t>(j * lb), lb,
                        lat.begin() + static_cast<int64_t>(w * lb));
            codes[w] = codes[j];
            for (size_t r = 0; r < kk; ++r) {
                const uint16_t o = refs[j * kk + r];
                refs[w * kk + r] = o == kNoRef ? kNoRef : renumber[o];
            }
            ++w;
        }
        lat.resize(w * lb);
        refs.resize(w * kk);
        codes.resize(w);
        plan_.err[sl].clear();
    }
    size_t left = 0;
    for (size_t j = 0; j < n; ++j) {
        if (exact[j]) {
            region_.ref_flag[plan_.tokens[j]] = 1;
        } else {
            plan_.tokens[left++] = plan_.tokens[j];
        }
    }
    plan_.tokens.resize(left);
    region_.sync_ref_list();
}

}  // namespace deltaserve::kvstore
