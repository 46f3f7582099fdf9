#include "deltaserve/kvstore/evicting_cache.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "deltaserve/kernels/attention_scores.h"
#include "row_io.h"

namespace deltaserve::kvstore {

namespace {

class PoolUnitView final : public UnitView {
  public:
    PoolUnitView(const HeadSlotPool& pool, int32_t unit, const int32_t* slots)
        : pool_(pool), unit_(unit), slots_(slots) {}
    void key(int32_t j, float* out) const override {
        const size_t hb = pool_.head_bytes();
        read_kv_row(pool_.options().dtype,
                    pool_.k_base(unit_) + static_cast<size_t>(slots_[j]) * hb, out,
                    pool_.options().head_dim);
    }

  private:
    const HeadSlotPool& pool_;
    int32_t unit_;
    const int32_t* slots_;
};

}  // namespace

EvictingSequenceCache::EvictingSequenceCache(HeadSlotPool& pool,
                                             std::unique_ptr<EvictionPolicy> policy,
                                             const EvictionConfig& config,
                                             std::vector<bool> window_layer, int32_t window)
    : pool_(pool),
      policy_(std::move(policy)),
      config_(config),
      window_layer_(std::move(window_layer)),
      window_(window_layer_.empty() ? 0 : std::max(0, window)) {
    const int32_t n_layers = pool_.options().n_layers;
    DS_CHECK(window_layer_.empty() || static_cast<int32_t>(window_layer_.size()) == n_layers,
             "window layers given for another number of layers");
    window_layer_.resize(static_cast<size_t>(n_layers), false);
    for (int32_t u = 0; u < pool_.n_units(); ++u) {
        if (!is_window_layer(u / pool_.options().n_kv_heads)) ranked_.push_back(u);
    }
    units_.resize(static_cast<size_t>(pool_.n_units()));
    lists_.resize(static_cast<size_t>(pool_.options().n_kv_heads));
    counts_.resize(lists_.size());
}

EvictingSequenceCache::~EvictingSequenceCache() {
    for (int32_t u = 0; u < pool_.n_units(); ++u) pool_.release(u, units_[u].slot);
}

size_t EvictingSequenceCache::entry_bytes() const {
    const size_t stat = policy_->stat() == AttentionStat::kNone ? 0 : sizeof(float);
    return 2 * pool_.head_bytes() + 2 * sizeof(int32_t) + stat;  // K, V, slot id, position
}

int32_t EvictingSequenceCache::budget(int32_t n_tokens) const {
    const double full_entry = 2.0 * 2.0 * pool_.options().head_dim;  // fp16 K and V
    const double entries =
        std::floor(config_.keep * n_tokens * full_entry / static_cast<double>(entry_bytes()));
    return std::max<int32_t>(1, static_cast<int32_t>(entries));
}

Status EvictingSequenceCache::reserve(int32_t n_new) {
    if (n_new <= n_reserved_) return Status();
    const int32_t more = n_new - n_reserved_;
    for (int32_t u = 0; u < pool_.n_units(); ++u) {
        auto slots = pool_.allocate(u, more);
        if (!slots.ok()) {
            for (int32_t w = 0; w < u; ++w) {  // give back what this call took
                Unit& unit = units_[w];
                pool_.release(w,
                              std::span<const int32_t>(unit.slot).last(static_cast<size_t>(more)));
                unit.slot.resize(unit.slot.size() - static_cast<size_t>(more));
                unit.pos.resize(unit.slot.size());
                unit.stat.resize(unit.slot.size());
            }
            return slots.status();
        }
        Unit& unit = units_[u];
        unit.slot.insert(unit.slot.end(), slots->begin(), slots->end());
        for (int32_t i = n_reserved_; i < n_new; ++i) unit.pos.push_back(n_tokens_ + i);
        unit.stat.resize(unit.slot.size(), 0.0f);
    }
    n_reserved_ = n_new;
    return Status();
}

Status EvictingSequenceCache::store(int32_t layer, int32_t first, int32_t n, const float* k,
                                    const float* v, int64_t ld) {
    DS_CHECK(first + n <= n_reserved_, "store past reserve");
    const auto& o = pool_.options();
    for (int32_t g = 0; g < o.n_kv_heads; ++g) {
        const int32_t u = pool_.unit(layer, g);
        const Unit& unit = units_[u];
        for (int32_t i = 0; i < n; ++i) {
            const int32_t slot = unit.slot[committed(unit) + first + i];
            const int64_t off = i * ld + static_cast<int64_t>(g) * o.head_dim;
            write_kv_row(o.dtype, pool_.k_row(u, slot), k + off, o.head_dim);
            write_kv_row(o.dtype, pool_.v_row(u, slot), v + off, o.head_dim);
        }
    }
    return Status();
}

kernels::KvView EvictingSequenceCache::view(int32_t layer, int32_t n_visible_new) const {
    const int32_t u0 = pool_.unit(layer, 0);
    for (size_t g = 0; g < lists_.size(); ++g) {
        const Unit& unit = units_[u0 + g];
        lists_[g] = unit.slot.data();
        counts_[g] = committed(unit) + n_visible_new;
    }
    kernels::KvView v;
    v.dtype = pool_.options().dtype;
    v.k = pool_.k_base(u0);
    v.v = pool_.v_base(u0);
    v.row_stride = pool_.head_bytes();
    // Unit (layer, g) is g units after (layer, 0); each unit holds a K and a V arena.
    v.head_stride = static_cast<size_t>(
        pool_.k_base(u0 + std::min<int32_t>(1, pool_.options().n_kv_heads - 1)) - pool_.k_base(u0));
    v.head_slots = lists_.data();
    v.head_n = counts_.data();
    // A window layer holds consecutive positions: the kernel's window over entries is the
    // window over positions.
    v.window = is_window_layer(layer) ? window_ : 0;
    return v;
}

Status EvictingSequenceCache::observe(int32_t layer, const kernels::AttentionShape& shape,
                                      const float* q, int64_t ldq, const float* hidden, int64_t ldh,
                                      int32_t n, ThreadPool& threads) {
    const AttentionStat stat = policy_->stat();
    if (stat == AttentionStat::kNone || is_window_layer(layer)) return Status();  // not ranked
    if (!policy_->continual() && n == 1)
        return Status();  // it shrinks after prompts only: nothing to gather
    if (stat == AttentionStat::kTokenGate) {
        const int32_t heads = pool_.options().n_kv_heads;
        std::vector<float> gate(static_cast<size_t>(n) * heads);
        policy_->token_gate(layer, hidden, ldh, n, gate.data());
        for (int32_t g = 0; g < heads; ++g) {
            Unit& unit = units_[pool_.unit(layer, g)];
            const int32_t first = committed(unit);  // the new entries follow the committed ones
            for (int32_t i = 0; i < n; ++i)
                unit.stat[first + i] = gate[static_cast<size_t>(i) * heads + g];
        }
        return Status();
    }
    const kernels::KvView v = view(layer, n);
    const int32_t u0 = pool_.unit(layer, 0);
    // Which queries count, and whether earlier statistics are dropped first.
    const bool squared = stat == AttentionStat::kSquaredWindowThenDecode;
    const int32_t window = squared ? 8 : config_.window;
    const bool reset = stat == AttentionStat::kLastWindow || (squared && n > 1);
    std::vector<float*> sums(lists_.size());
    for (size_t g = 0; g < sums.size(); ++g) {
        Unit& unit = units_[u0 + g];
        if (reset) std::fill(unit.stat.begin(), unit.stat.end(), 0.0f);
        sums[g] = unit.stat.data();
    }
    const int32_t first = stat == AttentionStat::kAllQueries ? 0 : std::max(0, n - window);
    kernels::attention_column_sums(shape, v, q, ldq, n, first, squared ? 2 : 1, sums.data(),
                                   threads);
    return Status();
}

Status EvictingSequenceCache::commit(int32_t n) {
    DS_CHECK(n <= n_reserved_, "commit past reserve");
    n_reserved_ -= n;
    n_tokens_ += n;
    drop_before_window(n_tokens_);
    if (policy_->continual() || n > 1) shrink();
    return Status();
}

void EvictingSequenceCache::drop_before_window(int32_t from) {
    if (window_ == 0) return;
    const int32_t first = std::max(0, from - window_ + 1 - kWindowSlack);
    if (first <= window_first_) return;
    for (int32_t u = 0; u < pool_.n_units(); ++u) {
        if (!is_window_layer(u / pool_.options().n_kv_heads)) continue;
        const Unit& unit = units_[u];
        drop(u, [&](size_t j) { return unit.pos[j] < first; });
    }
    window_first_ = first;
}

void EvictingSequenceCache::shrink() {
    if (ranked_.empty()) return;
    // The policy sees the global layers' units only, numbered among themselves.
    const int32_t heads = pool_.options().n_kv_heads;
    std::vector<PoolUnitView> views;
    views.reserve(ranked_.size());
    for (size_t i = 0; i < ranked_.size(); ++i) {
        const int32_t u = ranked_[i];
        Unit& unit = units_[u];
        views.emplace_back(pool_, u, unit.slot.data());
        views.back().n = committed(unit);
        views.back().pos = unit.pos.data();
        views.back().stat = unit.stat.data();
        views.back().head_dim = pool_.options().head_dim;
        views.back().layer = static_cast<int32_t>(i) / heads;
        views.back().n_layers = static_cast<int32_t>(ranked_.size()) / heads;
        views.back().n_tokens = n_tokens_;
        views.back().state = &unit.state;
    }
    std::vector<const UnitView*> ptrs;
    for (const auto& v : views) ptrs.push_back(&v);
    const int64_t total = static_cast<int64_t>(budget(n_tokens_)) * std::ssize(ranked_);
    std::vector<int32_t> per_unit = policy_->budgets(ptrs, total);
    if (per_unit.empty()) per_unit.assign(ranked_.size(), budget(n_tokens_));
    std::vector<uint8_t> keep;
    for (size_t i = 0; i < ranked_.size(); ++i) {
        const int32_t u = ranked_[i];
        const int32_t n = committed(units_[u]);
        const int32_t keep_n = per_unit[i];
        if (n <= keep_n) continue;
        keep.assign(static_cast<size_t>(n), 0);
        policy_->select(views[i], keep_n, keep);
        apply_merges(u, policy_->merges(views[i], keep));
        // Reserved entries (j >= n) stay.
        drop(u, [&](size_t j) { return j < static_cast<size_t>(n) && !keep[j]; });
    }
}

template <class Drop>
void EvictingSequenceCache::drop(int32_t u, Drop&& dropped) {
    Unit& unit = units_[u];
    std::vector<int32_t> freed;
    size_t w = 0;
    for (size_t j = 0; j < unit.slot.size(); ++j) {
        if (dropped(j)) {
            freed.push_back(unit.slot[j]);
            continue;
        }
        unit.slot[w] = unit.slot[j];
        unit.pos[w] = unit.pos[j];
        unit.stat[w] = unit.stat[j];
        ++w;
    }
    unit.slot.resize(w);
    unit.pos.resize(w);
    unit.stat.resize(w);
    pool_.release(u, freed);
}

void EvictingSequenceCache::apply_merges(int32_t u,
                                         const std::vector<EvictionPolicy::Merge>& merges) {
    if (merges.empty()) return;
    const auto& o = pool_.options();
    const Unit& unit = units_[u];
    std::vector<float> acc_k(o.head_dim), acc_v(o.head_dim), x(o.head_dim);
    // Merges grouped by target: the target's weight is the same in each of its merges.
    std::vector<size_t> order(merges.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return merges[a].to < merges[b].to; });
    for (size_t i = 0; i < order.size();) {
        const int32_t to = merges[order[i]].to;
        uint8_t* kt = pool_.k_row(u, unit.slot[to]);
        uint8_t* vt = pool_.v_row(u, unit.slot[to]);
        read_kv_row(o.dtype, kt, acc_k.data(), o.head_dim);
        read_kv_row(o.dtype, vt, acc_v.data(), o.head_dim);
        for (float& t : acc_k) t *= merges[order[i]].w_to;
        for (float& t : acc_v) t *= merges[order[i]].w_to;
        for (; i < order.size() && merges[order[i]].to == to; ++i) {
            const auto& m = merges[order[i]];
            read_kv_row(o.dtype, pool_.k_row(u, unit.slot[m.from]), x.data(), o.head_dim);
            for (int32_t d = 0; d < o.head_dim; ++d) acc_k[d] += m.w_from * x[d];
            read_kv_row(o.dtype, pool_.v_row(u, unit.slot[m.from]), x.data(), o.head_dim);
            for (int32_t d = 0; d < o.head_dim; ++d) acc_v[d] += m.w_from * x[d];
        }
        write_kv_row(o.dtype, kt, acc_k.data(), o.head_dim);
        write_kv_row(o.dtype, vt, acc_v.data(), o.head_dim);
    }
}

int32_t EvictingSequenceCache::kept_by_truncate(int32_t n_keep) const {
    if (window_first_ == 0 || n_keep >= n_tokens_) return n_keep;
    // The query at n_keep sees the window from n_keep - window + 1.
    return std::max(0, n_keep - window_ + 1) >= window_first_ ? n_keep : 0;
}

void EvictingSequenceCache::truncate(int32_t n_keep) {
    DS_CHECK(n_keep >= 0 && n_keep <= n_tokens_, "truncate past the end");
    n_keep = kept_by_truncate(n_keep);
    for (int32_t u = 0; u < pool_.n_units(); ++u) {
        const Unit& unit = units_[u];
        drop(u, [&](size_t j) { return unit.pos[j] >= n_keep; });
    }
    if (n_keep == 0) window_first_ = 0;
    n_tokens_ = n_keep;
    n_reserved_ = 0;
}

size_t EvictingSequenceCache::bytes() const {
    size_t entries = 0;
    for (const Unit& u : units_) entries += u.slot.size();
    return entries * entry_bytes() + units_.size() * sizeof(float);  // + each unit's policy state
}

int32_t EvictingSequenceCache::window_entries(int32_t n_tokens) const {
    return std::min(n_tokens, window_ - 1 + kWindowSlack);
}

size_t EvictingSequenceCache::bytes_bound(int32_t n_tokens) const {
    n_tokens = std::max(n_tokens, 0);
    const auto ranked = static_cast<size_t>(std::min(n_tokens, budget(n_tokens)));
    const size_t windowed = window_ > 0 ? static_cast<size_t>(window_entries(n_tokens)) : 0;
    const size_t n_window_units = units_.size() - ranked_.size();
    return (ranked_.size() * ranked + n_window_units * windowed) * entry_bytes() +
           units_.size() * sizeof(float);
}

std::span<const int32_t> EvictingSequenceCache::positions(int32_t layer, int32_t head) const {
    const Unit& u = units_[pool_.unit(layer, head)];
    return std::span<const int32_t>(u.pos.data(), static_cast<size_t>(committed(u)));
}

}  // namespace deltaserve::kvstore
