#include <immintrin.h>

#include <cstring>

#include "deltaserve/common/fp16.h"
#include "deltaserve/kvstore/kv_cache.h"

namespace deltaserve::kvstore {

FullSequenceCache::~FullSequenceCache() { pool_.release(slots_); }

Status FullSequenceCache::reserve(int32_t n_new) {
    // Slots reserved earlier but never committed are reused.
    const int32_t have = static_cast<int32_t>(slots_.size()) - n_committed_;
    if (n_new <= have) return Status();
    DS_ASSIGN_OR_RETURN(std::vector<int32_t> more, pool_.allocate(n_new - have));
    slots_.insert(slots_.end(), more.begin(), more.end());
    return Status();
}

void FullSequenceCache::store(int32_t layer, int32_t first, int32_t n, const float* k,
                              const float* v, int64_t ld) {
    const int32_t kv_dim = pool_.options().kv_dim;
    DS_CHECK(n_committed_ + first + n <= static_cast<int32_t>(slots_.size()), "store past reserve");
    for (int32_t i = 0; i < n; ++i) {
        const int32_t slot = slots_[n_committed_ + first + i];
        const float* ks = k + i * ld;
        const float* vs = v + i * ld;
        if (pool_.options().dtype == kernels::DType::kF16) {
            auto* kd = reinterpret_cast<uint16_t*>(pool_.k_row(layer, slot));
            auto* vd = reinterpret_cast<uint16_t*>(pool_.v_row(layer, slot));
            int32_t d = 0;
            for (; d + 8 <= kv_dim; d += 8) {  // F16C, round to nearest even
                _mm_storeu_si128(reinterpret_cast<__m128i*>(kd + d),
                                 _mm256_cvtps_ph(_mm256_loadu_ps(ks + d), _MM_FROUND_TO_NEAREST_INT));
                _mm_storeu_si128(reinterpret_cast<__m128i*>(vd + d),
                                 _mm256_cvtps_ph(_mm256_loadu_ps(vs + d), _MM_FROUND_TO_NEAREST_INT));
            }
            for (; d < kv_dim; ++d) {
                kd[d] = fp32_to_fp16(ks[d]);
                vd[d] = fp32_to_fp16(vs[d]);
            }
        } else {
            std::memcpy(pool_.k_row(layer, slot), ks, kv_dim * sizeof(float));
            std::memcpy(pool_.v_row(layer, slot), vs, kv_dim * sizeof(float));
        }
    }
}

kernels::KvView FullSequenceCache::view(int32_t layer, int32_t n_visible_new) const {
    kernels::KvView v;
    v.dtype = pool_.options().dtype;
    v.k = pool_.k_base(layer);
    v.v = pool_.v_base(layer);
    v.row_stride = pool_.row_bytes();
    v.head_stride = pool_.head_bytes();
    v.slots = slots_.data();
    v.n = n_committed_ + n_visible_new;
    return v;
}

void FullSequenceCache::commit(int32_t n) {
    DS_CHECK(n_committed_ + n <= static_cast<int32_t>(slots_.size()), "commit past reserve");
    n_committed_ += n;
}

void FullSequenceCache::truncate(int32_t n_keep) {
    DS_CHECK(n_keep >= 0 && n_keep <= n_committed_, "truncate past the end");
    pool_.release(std::span<const int32_t>(slots_).subspan(static_cast<size_t>(n_keep)));
    slots_.resize(static_cast<size_t>(n_keep));
    n_committed_ = n_keep;
}

size_t FullSequenceCache::bytes() const {
    return slots_.size() * pool_.row_bytes() * 2 * static_cast<size_t>(pool_.options().n_layers);
}

}  // namespace deltaserve::kvstore
