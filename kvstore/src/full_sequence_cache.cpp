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

FullSequenceCache::FullSequenceCache(std::shared_ptr<BlockPool> pool, int32_t max_tokens,
                                     KvLayerGroups groups, int32_t max_chunk)
    : pool_(std::move(pool)),
      max_tokens_(max_tokens),
      groups_(groups.group_layers > 0 ? std::move(groups)
                                      : KvLayerGroups::whole(pool_->options().n_layers)),
      max_chunk_(std::max(1, max_chunk)),
      tables_(static_cast<size_t>(groups_.n_groups())),
      slots_(static_cast<size_t>(groups_.n_groups())) {
    DS_CHECK(groups_.group_layers == pool_->options().n_layers,
             "the layer groups do not fit the pool's blocks");
}

FullSequenceCache::~FullSequenceCache() {
    for (const auto& table : tables_) {
        for (int32_t b : table) {
            if (b >= 0) pool_->release(std::span<const int32_t>(&b, 1));
        }
    }
}

Status FullSequenceCache::own_partial_block() {
    // Only a truncate leaves the next position inside a block another sequence may hold: the
    // blocks others take are whole ones, and a block is written only past the committed end.
    if (!partial_) return {};
    partial_ = false;
    const int32_t pb = n_committed_ / kB;
    if (n_committed_ % kB == 0) return {};
    std::vector<int32_t> shared;  // groups whose block there others hold
    for (int32_t g = 0; g < groups_.n_groups(); ++g) {
        const auto& table = tables_[static_cast<size_t>(g)];
        if (pb < static_cast<int32_t>(table.size()) && table[pb] >= 0 && pool_->refs(table[pb]) > 1)
            shared.push_back(g);
    }
    if (shared.empty()) return {};
    auto fresh = pool_->allocate(static_cast<int32_t>(shared.size()));
    if (!fresh.ok()) {
        partial_ = true;  // looked at again by the next reserve
        return fresh.status();
    }
    for (size_t i = 0; i < shared.size(); ++i) {
        const int32_t old = tables_[static_cast<size_t>(shared[i])][pb];
        if (Status st = pool_->copy_rows(BlockPool::slot((*fresh)[i], 0), BlockPool::slot(old, 0),
                                         n_committed_ % kB);
            !st.ok()) {
            pool_->release(*fresh);
            partial_ = true;
            return st;
        }
    }
    for (size_t i = 0; i < shared.size(); ++i) {
        auto& table = tables_[static_cast<size_t>(shared[i])];
        auto& slots = slots_[static_cast<size_t>(shared[i])];
        const int32_t old = table[pb];
        table[pb] = (*fresh)[i];
        for (int32_t p = pb * kB; p < n_slots_; ++p)
            slots[p] = BlockPool::slot((*fresh)[i], p % kB);
        pool_->release(std::span<const int32_t>(&old, 1));
    }
    return {};
}

void FullSequenceCache::drop_before(int32_t from) {
    if (!groups_.has_window()) return;
    const int32_t upto = std::max(0, from - groups_.window + 1 - kWindowSlack) / kB;
    for (int32_t g = 0; g < groups_.n_groups(); ++g) {
        if (!groups_.windowed[static_cast<size_t>(g)]) continue;
        auto& table = tables_[static_cast<size_t>(g)];
        auto& slots = slots_[static_cast<size_t>(g)];
        const int32_t end = std::min(upto, static_cast<int32_t>(table.size()));
        for (int32_t b = dropped_; b < end; ++b) {
            if (table[b] < 0) continue;
            pool_->release(std::span<const int32_t>(&table[b], 1));
            table[b] = -1;
            for (int32_t p = b * kB; p < std::min(n_slots_, b * kB + kB); ++p) slots[p] = -1;
        }
    }
    dropped_ = std::max(dropped_, upto);
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
    drop_before(n_committed_);  // this call's first query sees the window ending there
    if (total <= n_slots_) return Status();
    const int32_t nb = blocks_for(total);
    int32_t more = 0;
    for (int32_t g = 0; g < groups_.n_groups(); ++g) {
        const int32_t from = std::max(static_cast<int32_t>(tables_[static_cast<size_t>(g)].size()),
                                      groups_.windowed[static_cast<size_t>(g)] ? dropped_ : 0);
        more += std::max(0, nb - from);
    }
    std::vector<int32_t> got;  // (most steps need no new block: no trip to the pool's lock)
    if (more > 0) {
        DS_ASSIGN_OR_RETURN(got, pool_->allocate(more));
    }
    size_t next = 0;
    for (int32_t g = 0; g < groups_.n_groups(); ++g) {
        auto& table = tables_[static_cast<size_t>(g)];
        const int32_t skip = groups_.windowed[static_cast<size_t>(g)] ? dropped_ : 0;
        for (auto b = static_cast<int32_t>(table.size()); b < nb; ++b)
            table.push_back(b < skip ? -1 : got[next++]);
        auto& slots = slots_[static_cast<size_t>(g)];
        for (int32_t p = n_slots_; p < total; ++p) {
            const int32_t block = table[p / kB];
            slots.push_back(block < 0 ? -1 : BlockPool::slot(block, p % kB));
        }
    }
    n_slots_ = static_cast<int32_t>(total);
    return Status();
}

Status FullSequenceCache::store(int32_t layer, int32_t first, int32_t n, const float* k,
                                const float* v, int64_t ld) {
    DS_CHECK(n_committed_ + first + n <= n_slots_, "store past reserve");
    const auto g = static_cast<size_t>(groups_.group[layer]);
    return pool_->store(groups_.index[layer],
                        std::span<const int32_t>(slots_[g]).subspan(n_committed_ + first, n), k, v,
                        ld);
}

kernels::KvView FullSequenceCache::view(int32_t layer, int32_t n_visible_new) const {
    const auto g = static_cast<size_t>(groups_.group[layer]);
    const int32_t j = groups_.index[layer];
    const bool windowed = groups_.windowed[g];
    const int32_t from = windowed ? window_first() : 0;
    kernels::KvView v;
    v.dtype = pool_->options().dtype;
    v.k = pool_->k_base(j);
    v.v = pool_->v_base(j);
    v.row_stride = pool_->row_bytes();
    v.head_stride = pool_->head_bytes();
    v.slots = slots_[g].data() + from;
    v.n = n_committed_ + n_visible_new - from;
    v.window = windowed ? groups_.window : 0;
    return v;
}

Status FullSequenceCache::commit(int32_t n) {
    DS_CHECK(n_committed_ + n <= n_slots_, "commit past reserve");
    n_committed_ += n;
    return Status();
}

int32_t FullSequenceCache::kept_by_truncate(int32_t n_keep) const {
    if (dropped_ == 0 || n_keep >= n_committed_) return n_keep;
    return std::max(0, n_keep - groups_.window + 1) >= window_first() ? n_keep : 0;
}

void FullSequenceCache::truncate(int32_t n_keep) {
    DS_CHECK(n_keep >= 0 && n_keep <= n_committed_, "truncate past the end");
    n_keep = kept_by_truncate(n_keep);
    const auto keep_blocks = static_cast<size_t>(blocks_for(n_keep));
    for (size_t g = 0; g < tables_.size(); ++g) {
        auto& table = tables_[g];
        for (size_t b = keep_blocks; b < table.size(); ++b) {
            if (table[b] >= 0) pool_->release(std::span<const int32_t>(&table[b], 1));
        }
        table.resize(std::min(table.size(), keep_blocks));
        slots_[g].resize(static_cast<size_t>(n_keep));
    }
    if (n_keep == 0) dropped_ = 0;
    n_committed_ = n_slots_ = n_keep;
    partial_ = n_keep % kB != 0;
}

size_t FullSequenceCache::bytes() const {
    size_t rows = 0;  // (position, layer) rows held
    for (int32_t g = 0; g < groups_.n_groups(); ++g) {
        const int32_t from = groups_.windowed[static_cast<size_t>(g)] ? window_first() : 0;
        rows += static_cast<size_t>(std::max(0, n_slots_ - from)) *
                static_cast<size_t>(groups_.real_layers[static_cast<size_t>(g)]);
    }
    return rows * pool_->row_bytes() * 2;
}

size_t FullSequenceCache::held_bytes() const {
    size_t n = 0;
    for (const auto& table : tables_)
        n += static_cast<size_t>(
            std::count_if(table.begin(), table.end(), [](int32_t b) { return b >= 0; }));
    return n * pool_->block_bytes();
}

int32_t FullSequenceCache::window_blocks_bound(int32_t n_tokens) const {
    // A call's queries from m on see [m - window + 1, m) besides its own c <= max_chunk:
    // at most window - 1 + c positions and the slack, from a block's start (up to 15 before).
    const int64_t chunk = std::min<int64_t>(n_tokens, max_chunk_);
    return std::min<int32_t>(blocks_for(n_tokens),
                             blocks_for(groups_.window - 1 + kWindowSlack + chunk) + 1);
}

size_t FullSequenceCache::bytes_bound(int32_t n_tokens) const {
    n_tokens = std::max(n_tokens, 0);
    size_t blocks = 0;
    for (int32_t g = 0; g < groups_.n_groups(); ++g) {
        // One block more: the copy of a shared block a truncated sequence writes into.
        blocks += static_cast<size_t>((groups_.windowed[static_cast<size_t>(g)]
                                           ? window_blocks_bound(n_tokens)
                                           : blocks_for(n_tokens)) +
                                      1);
    }
    return blocks * pool_->block_bytes();
}

std::vector<int32_t> FullSequenceCache::blocks(int32_t n_blocks) const {
    DS_CHECK(n_blocks >= 0 && n_blocks <= n_committed_ / kB, "blocks past the committed ones");
    std::vector<int32_t> out;
    out.reserve(static_cast<size_t>(n_blocks) * tables_.size());
    for (int32_t b = 0; b < n_blocks; ++b) {
        for (const auto& table : tables_) out.push_back(table[b]);
    }
    return out;
}

Status FullSequenceCache::adopt_blocks(std::span<const int32_t> blocks) {
    if (n_slots_ != 0) return failed_precondition("adopting blocks into a cache that is not empty");
    const auto n_groups = static_cast<size_t>(groups_.n_groups());
    if (blocks.size() % n_groups != 0) {
        return invalid_argument("adopting " + std::to_string(blocks.size()) +
                                " block ids, not a whole number of " + std::to_string(n_groups) +
                                " per position block");
    }
    const auto nb = static_cast<int32_t>(blocks.size() / n_groups);
    // A window group needs the blocks the window ending at the last position reaches.
    const int32_t need = groups_.has_window() ? std::max(0, nb * kB - groups_.window + 1) / kB : 0;
    std::vector<int32_t> taken;
    for (int32_t b = 0; b < nb; ++b) {
        for (size_t g = 0; g < n_groups; ++g) {
            const int32_t id = blocks[static_cast<size_t>(b) * n_groups + g];
            if (groups_.windowed[g] && b < need) continue;
            if (id < 0 || id >= pool_->capacity() || pool_->refs(id) <= 0) {
                return invalid_argument(id < 0
                                            ? "adopting blocks without the window's rows they need"
                                            : "adopting a block not in use");
            }
            taken.push_back(id);
        }
    }
    pool_->retain(taken);
    dropped_ = need;
    for (size_t g = 0; g < n_groups; ++g) {
        auto& table = tables_[g];
        for (int32_t b = 0; b < nb; ++b) {
            table.push_back(groups_.windowed[g] && b < need
                                ? -1
                                : blocks[static_cast<size_t>(b) * n_groups + g]);
        }
        for (int32_t p = 0; p < nb * kB; ++p) {
            slots_[g].push_back(table[p / kB] < 0 ? -1 : BlockPool::slot(table[p / kB], p % kB));
        }
    }
    n_committed_ = n_slots_ = nb * kB;
    return {};
}

// ---- shipping ----

Result<std::vector<uint8_t>> FullSequenceCache::export_state() const {
    if (n_slots_ != n_committed_) {
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
    if (groups_.has_window()) {  // and which layers are window layers, a byte each
        w.i32(groups_.window);
        w.i32(groups_.n_layers());
        for (int32_t l = 0; l < groups_.n_layers(); ++l)
            out.push_back(groups_.is_window_layer(l) ? 1 : 0);
    }
    return out;
}

Result<std::vector<uint8_t>> FullSequenceCache::export_layer(int32_t layer) const {
    return export_rows(layer, 0, n_committed_);
}

Result<std::vector<uint8_t>> FullSequenceCache::export_rows(int32_t layer, int32_t begin,
                                                            int32_t end) const {
    if (layer < 0 || layer >= groups_.n_layers()) return invalid_argument("no such layer");
    if (begin < 0 || begin > end || end > n_slots_) {
        return invalid_argument("rows [" + std::to_string(begin) + ", " + std::to_string(end) +
                                ") are not in the cache (" + std::to_string(n_slots_) + ")");
    }
    const auto g = static_cast<size_t>(groups_.group[layer]);
    std::vector<uint8_t> out;
    int32_t first = begin;
    if (groups_.windowed[g]) {
        first = std::min(end, std::max(begin, window_first()));
        ByteWriter w(out);
        w.i32(first);
    }
    const size_t head = out.size();
    const auto n = static_cast<size_t>(end - first);
    out.resize(head + rows_bytes(end - first));
    DS_RETURN_IF_ERROR(
        pool_->read_rows(groups_.index[layer],
                         std::span<const int32_t>(slots_[g]).subspan(static_cast<size_t>(first), n),
                         out.data() + head));
    return out;
}

Status FullSequenceCache::import_state(std::span<const uint8_t> state) {
    if (n_slots_ != 0) return failed_precondition("importing into a cache that is not empty");
    ByteReader r(state);
    int32_t n = 0, row = 0, window = 0, n_layers = 0;
    std::span<const uint8_t> window_layer;
    if (!r.i32(n) || !r.i32(row) || n < 0 ||
        (r.remaining() > 0 && (!r.i32(window) || !r.i32(n_layers) || window <= 0 || n_layers <= 0 ||
                               r.remaining() != static_cast<size_t>(n_layers))) ||
        (window > 0 && (window_layer = r.take(static_cast<size_t>(n_layers))).empty())) {
        return data_loss("full-KV state: malformed (" + std::to_string(state.size()) + " bytes)");
    }
    if (static_cast<size_t>(row) != pool_->row_bytes()) {
        return failed_precondition("full-KV state: rows of " + std::to_string(row) +
                                   " bytes, this cache holds " +
                                   std::to_string(pool_->row_bytes()));
    }
    bool same_layers = window == 0 || n_layers == groups_.n_layers();
    for (int32_t l = 0; same_layers && window > 0 && l < n_layers; ++l)
        same_layers = (window_layer[static_cast<size_t>(l)] != 0) == groups_.is_window_layer(l);
    if (window != groups_.window || !same_layers) {
        return failed_precondition("full-KV state: sliding-window layers of " +
                                   std::to_string(window) + " tokens (0: none), this cache's are " +
                                   std::to_string(groups_.window) +
                                   (same_layers ? "" : ", or other layers"));
    }
    if (n > max_tokens_) {
        return resource_exhausted("full-KV state: " + std::to_string(n) +
                                  " tokens, more than the cache's " + std::to_string(max_tokens_));
    }
    drop_before(n);  // a window group takes the blocks the window ending at n reaches
    DS_RETURN_IF_ERROR(reserve(n));
    DS_RETURN_IF_ERROR(commit(n));                // (a full cache's commit has no error)
    for (size_t g = 0; g < slots_.size(); ++g) {  // zeros until a layer comes
        const int32_t from = groups_.windowed[g] ? window_first() : 0;
        const auto held = std::span<const int32_t>(slots_[g]).subspan(static_cast<size_t>(from));
        for (int32_t j = 0; j < pool_->options().n_layers; ++j) {
            if (Status st = pool_->write_rows(j, held, nullptr); !st.ok()) {
                truncate(0);
                return st;
            }
        }
    }
    return {};
}

Status FullSequenceCache::import_layer(int32_t layer, std::span<const uint8_t> part) {
    return import_rows(layer, 0, n_committed_, part);
}

Status FullSequenceCache::import_rows(int32_t layer, int32_t begin, int32_t end,
                                      std::span<const uint8_t> part) {
    if (layer < 0 || layer >= groups_.n_layers()) return invalid_argument("no such layer");
    if (begin < 0 || begin > end || end > n_committed_) {
        return invalid_argument("rows [" + std::to_string(begin) + ", " + std::to_string(end) +
                                ") are not in the imported state (" + std::to_string(n_committed_) +
                                " tokens)");
    }
    const auto g = static_cast<size_t>(groups_.group[layer]);
    const std::string what = "full-KV layer " + std::to_string(layer) + " rows [" +
                             std::to_string(begin) + ", " + std::to_string(end) + ")";
    int32_t first = begin;
    if (groups_.windowed[g]) {
        ByteReader r(part);
        if (!r.i32(first) || first < begin || first > end)
            return data_loss(what + ": a window layer's part without its first position");
        part = part.subspan(4);
        // Every row the cache holds (from window_first()) must come.
        if (first > std::max(begin, window_first())) {
            return data_loss(what + ": the rows from " + std::to_string(first) +
                             ", but the window needs them from " +
                             std::to_string(std::max(begin, window_first())));
        }
    }
    if (part.size() != rows_bytes(end - first)) {
        return data_loss(what + ": " + std::to_string(part.size()) + " bytes, expected " +
                         std::to_string(rows_bytes(end - first)));
    }
    // A window layer's rows before what it holds are not needed.
    const int32_t from = groups_.windowed[g] ? std::max(first, window_first()) : first;
    if (from >= end) return {};
    const size_t row = pool_->row_bytes();
    const auto n = static_cast<size_t>(end - from), skip = static_cast<size_t>(from - first);
    const size_t total = static_cast<size_t>(end - first);
    // The part is K rows then V rows: take the held ones of each.
    std::vector<uint8_t> held;
    const uint8_t* bytes = part.data();
    if (skip > 0) {
        held.resize(2 * row * n);
        std::memcpy(held.data(), part.data() + skip * row, n * row);
        std::memcpy(held.data() + n * row, part.data() + (total + skip) * row, n * row);
        bytes = held.data();
    }
    return pool_->write_rows(
        groups_.index[layer],
        std::span<const int32_t>(slots_[g]).subspan(static_cast<size_t>(from), n), bytes);
}

}  // namespace deltaserve::kvstore
