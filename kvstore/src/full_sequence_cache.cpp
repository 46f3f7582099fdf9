#include <algorithm>
#include <cstring>
#include <string>

#include "byte_io.h"
#include "deltaserve/kvstore/kv_cache.h"

namespace deltaserve::kvstore {

namespace {
constexpr int32_t kB = BlockPool::kBlockTokens;
int32_t blocks_for(int64_t n_tokens) { return static_cast<int32_t>((n_tokens + kB - 1) / kB); }
}  // namespace

FullSequenceCache::~FullSequenceCache() { pool_->release(table_); }

Status FullSequenceCache::own_partial_block() {
    // Only a truncate leaves the next position inside a block another sequence may hold: the
    // blocks others take are whole ones, and a block is written only past the committed end.
    if (!partial_) return {};
    partial_ = false;
    if (n_committed_ % kB == 0 || n_committed_ / kB >= static_cast<int32_t>(table_.size()))
        return {};
    const int32_t old = table_[n_committed_ / kB];
    if (pool_->refs(old) <= 1) return {};
    auto fresh = pool_->allocate(1);
    if (!fresh.ok()) {
        partial_ = true;  // looked at again by the next reserve
        return fresh.status();
    }
    if (Status st = pool_->copy_rows(BlockPool::slot((*fresh)[0], 0), BlockPool::slot(old, 0),
                                     n_committed_ % kB);
        !st.ok()) {
        pool_->release(*fresh);
        partial_ = true;
        return st;
    }
    table_[n_committed_ / kB] = (*fresh)[0];
    const int32_t first = n_committed_ / kB * kB;
    for (int32_t p = first; p < static_cast<int32_t>(slots_.size()); ++p)
        slots_[p] = BlockPool::slot((*fresh)[0], p - first);
    pool_->release(std::span<const int32_t>(&old, 1));
    return {};
}

Status FullSequenceCache::reserve(int32_t n_new) {
    if (n_new < 0) return invalid_argument("a negative reserve");
    DS_RETURN_IF_ERROR(own_partial_block());
    // Positions reserved earlier but never committed are reused.
    const int64_t total = static_cast<int64_t>(n_committed_) + n_new;
    if (total > max_tokens_) {
        return resource_exhausted("the sequence would hold " + std::to_string(total) +
                                  " tokens, more than its " + std::to_string(max_tokens_));
    }
    if (total <= static_cast<int64_t>(slots_.size())) return Status();
    const int32_t more = blocks_for(total) - static_cast<int32_t>(table_.size());
    if (more > 0) {
        DS_ASSIGN_OR_RETURN(std::vector<int32_t> got, pool_->allocate(more));
        table_.insert(table_.end(), got.begin(), got.end());
    }
    for (auto p = static_cast<int32_t>(slots_.size()); p < total; ++p)
        slots_.push_back(BlockPool::slot(table_[p / kB], p % kB));
    return Status();
}

Status FullSequenceCache::store(int32_t layer, int32_t first, int32_t n, const float* k,
                                const float* v, int64_t ld) {
    DS_CHECK(n_committed_ + first + n <= static_cast<int32_t>(slots_.size()), "store past reserve");
    return pool_->store(layer, std::span<const int32_t>(slots_).subspan(n_committed_ + first, n), k,
                        v, ld);
}

kernels::KvView FullSequenceCache::view(int32_t layer, int32_t n_visible_new) const {
    kernels::KvView v;
    v.dtype = pool_->options().dtype;
    v.k = pool_->k_base(layer);
    v.v = pool_->v_base(layer);
    v.row_stride = pool_->row_bytes();
    v.head_stride = pool_->head_bytes();
    v.slots = slots_.data();
    v.n = n_committed_ + n_visible_new;
    return v;
}

Status FullSequenceCache::commit(int32_t n) {
    DS_CHECK(n_committed_ + n <= static_cast<int32_t>(slots_.size()), "commit past reserve");
    n_committed_ += n;
    return Status();
}

void FullSequenceCache::truncate(int32_t n_keep) {
    DS_CHECK(n_keep >= 0 && n_keep <= n_committed_, "truncate past the end");
    const size_t keep_blocks = static_cast<size_t>(blocks_for(n_keep));
    pool_->release(std::span<const int32_t>(table_).subspan(keep_blocks));
    table_.resize(keep_blocks);
    slots_.resize(static_cast<size_t>(n_keep));
    n_committed_ = n_keep;
    partial_ = n_keep % kB != 0;
}

size_t FullSequenceCache::bytes() const {
    return slots_.size() * pool_->row_bytes() * 2 * static_cast<size_t>(pool_->options().n_layers);
}

size_t FullSequenceCache::held_bytes() const { return table_.size() * pool_->block_bytes(); }

size_t FullSequenceCache::bytes_bound(int32_t n_tokens) const {
    // One block more: the copy of a shared block a truncated sequence writes into.
    return static_cast<size_t>(blocks_for(std::max(n_tokens, 0)) + 1) * pool_->block_bytes();
}

std::vector<int32_t> FullSequenceCache::blocks(int32_t n_blocks) const {
    DS_CHECK(n_blocks >= 0 && n_blocks <= n_committed_ / kB, "blocks past the committed ones");
    return std::vector<int32_t>(table_.begin(), table_.begin() + n_blocks);
}

Status FullSequenceCache::adopt_blocks(std::span<const int32_t> blocks) {
    if (!slots_.empty())
        return failed_precondition("adopting blocks into a cache that is not empty");
    for (int32_t b : blocks) {
        if (pool_->refs(b) <= 0) return invalid_argument("adopting a block not in use");
    }
    pool_->retain(blocks);
    table_.assign(blocks.begin(), blocks.end());
    for (int32_t p = 0; p < static_cast<int32_t>(blocks.size()) * kB; ++p)
        slots_.push_back(BlockPool::slot(table_[p / kB], p % kB));
    n_committed_ = static_cast<int32_t>(slots_.size());
    return {};
}

// ---- shipping ----

Result<std::vector<uint8_t>> FullSequenceCache::export_state() const {
    if (static_cast<int32_t>(slots_.size()) != n_committed_) {
        return failed_precondition("cannot export a cache with reserved positions");
    }
    return export_rows_state(n_committed_);
}

Result<std::vector<uint8_t>> FullSequenceCache::export_rows_state(int32_t n_tokens) const {
    if (n_tokens < 0) return invalid_argument("a negative token count");
    std::vector<uint8_t> out;
    ByteWriter w(out);
    w.i32(n_tokens);
    w.i32(static_cast<int32_t>(pool_->row_bytes()));
    return out;
}

Result<std::vector<uint8_t>> FullSequenceCache::export_layer(int32_t layer) const {
    return export_rows(layer, 0, n_committed_);
}

Result<std::vector<uint8_t>> FullSequenceCache::export_rows(int32_t layer, int32_t begin,
                                                            int32_t end) const {
    if (layer < 0 || layer >= pool_->options().n_layers) return invalid_argument("no such layer");
    if (begin < 0 || begin > end || end > static_cast<int32_t>(slots_.size())) {
        return invalid_argument("rows [" + std::to_string(begin) + ", " + std::to_string(end) +
                                ") are not in the cache (" + std::to_string(slots_.size()) + ")");
    }
    const size_t n = static_cast<size_t>(end - begin);
    std::vector<uint8_t> out(2 * pool_->row_bytes() * n);
    DS_RETURN_IF_ERROR(pool_->read_rows(
        layer, std::span<const int32_t>(slots_).subspan(static_cast<size_t>(begin), n),
        out.data()));
    return out;
}

Status FullSequenceCache::import_state(std::span<const uint8_t> state) {
    if (!slots_.empty()) return failed_precondition("importing into a cache that is not empty");
    ByteReader r(state);
    int32_t n = 0, row = 0;
    if (!r.i32(n) || !r.i32(row) || r.remaining() != 0 || n < 0) {
        return data_loss("full-KV state: malformed (" + std::to_string(state.size()) + " bytes)");
    }
    if (static_cast<size_t>(row) != pool_->row_bytes()) {
        return failed_precondition("full-KV state: rows of " + std::to_string(row) +
                                   " bytes, this cache holds " +
                                   std::to_string(pool_->row_bytes()));
    }
    DS_RETURN_IF_ERROR(reserve(n));
    DS_RETURN_IF_ERROR(commit(n));  // (a full cache's commit has no error)
    for (int32_t l = 0; l < pool_->options().n_layers; ++l) {  // zeros until a layer comes
        if (Status st = pool_->write_rows(l, slots_, nullptr); !st.ok()) {
            truncate(0);
            return st;
        }
    }
    return {};
}

Status FullSequenceCache::import_layer(int32_t layer, std::span<const uint8_t> part) {
    return import_rows(layer, 0, n_committed_, part);
}

Status FullSequenceCache::import_rows(int32_t layer, int32_t begin, int32_t end,
                                      std::span<const uint8_t> part) {
    if (layer < 0 || layer >= pool_->options().n_layers) return invalid_argument("no such layer");
    if (begin < 0 || begin > end || end > n_committed_) {
        return invalid_argument("rows [" + std::to_string(begin) + ", " + std::to_string(end) +
                                ") are not in the imported state (" + std::to_string(n_committed_) +
                                " tokens)");
    }
    const size_t row = pool_->row_bytes();
    const size_t n = static_cast<size_t>(end - begin);
    if (part.size() != 2 * row * n) {
        return data_loss("full-KV layer " + std::to_string(layer) + " rows [" +
                         std::to_string(begin) + ", " + std::to_string(end) +
                         "): " + std::to_string(part.size()) + " bytes, expected " +
                         std::to_string(2 * row * n));
    }
    return pool_->write_rows(
        layer, std::span<const int32_t>(slots_).subspan(static_cast<size_t>(begin), n),
        part.data());
}

}  // namespace deltaserve::kvstore
