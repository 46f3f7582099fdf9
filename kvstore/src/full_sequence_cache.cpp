#include "deltaserve/kvstore/kv_cache.h"
#include "row_io.h"

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
        const kernels::DType dtype = pool_.options().dtype;
        write_row(dtype, pool_.k_row(layer, slot), k + i * ld, kv_dim);
        write_row(dtype, pool_.v_row(layer, slot), v + i * ld, kv_dim);
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
