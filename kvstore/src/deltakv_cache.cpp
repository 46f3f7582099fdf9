#include "deltaserve/kvstore/deltakv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <numeric>
#include <utility>

#include "deltaserve/kernels/matmul.h"
#include "row_io.h"

namespace deltaserve::kvstore {

namespace k = deltaserve::kernels;

namespace {

// Points a cache's threads at a call's pool for the call, and back after.
class CallThreads {
  public:
    CallThreads(ThreadPool*& slot, ThreadPool& pool) : slot_(slot), saved_(slot) { slot = &pool; }
    ~CallThreads() { slot_ = saved_; }
    CallThreads(const CallThreads&) = delete;
    CallThreads& operator=(const CallThreads&) = delete;

  private:
    ThreadPool*& slot_;
    ThreadPool* const saved_;
};

// Scratch that only grows, so steps of varying sizes neither allocate nor clear it.
template <class T>
void grow(std::vector<T>& v, size_t n) {
    if (v.size() < n) v.resize(n);
}

// A latent token's bytes in one sparse layer: its latent and its references' ordinals.
double latent_token_bytes(const DeltaKvProfile& profile, const DeltaKvOptions& o) {
    const size_t latent =
        o.latent_bits == 4 ? k::int4_bytes(profile.m) : 2 * static_cast<size_t>(profile.m);
    return static_cast<double>(latent + sizeof(uint16_t) * o.k);
}

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

DeltaKvOptions deltakv_options_for_keep(const DeltaKvProfile& profile, float keep,
                                        DeltaKvOptions o) {
    const int32_t n_layers = o.n_layers;
    if (keep < 0.25f) {  // fewer references and a shorter buffer
        o.stride = 2 * profile.stride;
        o.window = 32;
    }
    // Bytes per token of a sparse layer over fp16 full KV, at a 2k-token context.
    const double full_token = 2.0 * 2.0 * o.n_kv_heads * o.head_dim;
    const double latent = latent_token_bytes(profile, o);
    const double n = 2048.0;
    const double s = 1.0 / o.stride + latent / full_token + (1.5 * o.window + o.sinks) / n;
    int32_t n_full = static_cast<int32_t>(std::floor((keep - s) / (1.0 - s) * n_layers));
    n_full = std::clamp(n_full, 1, n_layers);
    o.keep = keep;
    // The observation layer calibration measured, then the most sensitive layers. A profile
    // that orders only some layers (or none) falls back to the first layers.
    o.full_layer.assign(static_cast<size_t>(n_layers), 0);
    int32_t chosen = 0;
    if (profile.observation_layer >= 0 && profile.observation_layer < n_layers) {
        o.full_layer[profile.observation_layer] = 1;
        chosen = 1;
    }
    for (int32_t l : profile.sensitivity_order) {
        if (chosen >= n_full) break;
        if (l >= 0 && l < n_layers && !o.full_layer[l]) {
            o.full_layer[l] = 1;
            ++chosen;
        }
    }
    for (int32_t l = 0; l < n_layers && chosen < n_full; ++l) {
        if (!o.full_layer[l]) {
            o.full_layer[l] = 1;
            ++chosen;
        }
    }
    return o;
}

double deltakv_keep_floor(const DeltaKvProfile& profile, const DeltaKvOptions& o,
                          int32_t n_tokens) {
    const double n = std::max(1, n_tokens);
    const double row = 2.0 * 2.0 * o.n_kv_heads * o.head_dim;  // fp16 K and V
    const double latent = latent_token_bytes(profile, o);
    const double exact = std::min(1.0, 1.0 / o.stride + (1.5 * o.window + o.sinks) / n);
    const double sparse = exact * row + (1.0 - exact) * latent;
    // As bytes_upto(): per position its slots, latent index and reference flag; ref_list_.
    const double meta = 3 * sizeof(int32_t) + 1 + sizeof(int32_t) / static_cast<double>(o.stride);
    return (row + (o.n_layers - 1) * sparse + meta) / (o.n_layers * row);
}

void prepare_int4_decoders(DeltaKvProfile& profile) {
    profile.int4.clear();
    profile.int4_k.clear();
    for (const auto& layer : profile.layers) {
        profile.int4.push_back(k::make_int4_decoder(layer));
        profile.int4_k.push_back(k::make_int4_decoder(layer, layer.d() / 2));
    }
}

Status DeltaKvOptions::validate() const {
    const auto bad = [](const std::string& what) { return invalid_argument("DeltaKV: " + what); };
    if (n_layers < 1 || n_kv_heads < 1 || head_dim < 2 || head_dim % 2 != 0)
        return bad("the model's shape (layers, KV heads, an even head_dim) is not set");
    if (!(rope_theta > 0.0f)) return bad("rope_theta must be positive");
    if (static_cast<int32_t>(full_layer.size()) != n_layers ||
        std::find(full_layer.begin(), full_layer.end(), 1) == full_layer.end()) {
        return bad("at least one layer must be a full-attention layer");
    }
    if (sinks < 1) return bad("sinks must be at least 1");
    if (stride < 1) return bad("stride must be at least 1");
    if (k < 1 || k > 16) return bad("k (references per latent) must be in [1, 16]");
    if (window < 1) return bad("window must be at least 1");
    if (latent_bits != 4 && latent_bits != 16) return bad("latent_bits must be 4 or 16");
    if (!(select_ratio > 0.0f && select_ratio <= 1.0f))
        return bad("select_ratio must be in (0, 1]");
    if (!(pin_ratio >= 0.0f && pin_ratio < 1.0f)) return bad("pin_ratio must be in [0, 1)");
    if (pin_window < 1 || pin_after < 0 || pin_before < 0)
        return bad("pin_window must be at least 1, pin_after and pin_before at least 0");
    if (follow < 0 || follow_ahead < 0) return bad("follow and follow_ahead must be at least 0");
    if (!(exact_share >= 0.0f && exact_share < 1.0f)) return bad("exact_share must be in [0, 1)");
    if (!(exact_depth > 0.0f && exact_depth <= 1.0f)) return bad("exact_depth must be in (0, 1]");
    if (score_every < 0) return bad("score_every must be at least 0");
    if (!(score_dims > 0.0f && score_dims <= 1.0f)) return bad("score_dims must be in (0, 1]");
    if (prefill_select < 0) return bad("prefill_select must be at least 0");
    if (!(keep >= 0.0f && keep <= 1.0f)) return bad("keep must be in [0, 1]");
    if (!(logit_correction >= 0.0f && std::isfinite(logit_correction)))
        return bad("logit_correction must be finite and at least 0");
    if (n_ctx < 1) return bad("n_ctx must be at least 1");
    // A latent names its references by 16-bit ordinals.
    if (static_cast<int64_t>(sinks) + n_ctx / stride +
            static_cast<int64_t>(std::ceil(exact_share * static_cast<double>(n_ctx))) + 1 >=
        0xffff) {
        return bad(std::to_string(n_ctx) + " tokens at reference stride " + std::to_string(stride) +
                   " take more than 65534 references");
    }
    return Status();
}

Result<std::unique_ptr<DeltaKvSequenceCache>> DeltaKvSequenceCache::create(
    const DeltaKvProfile& profile, const DeltaKvOptions& o, ThreadPool& threads) {
    DS_RETURN_IF_ERROR(o.validate());
    if (static_cast<int32_t>(profile.layers.size()) != o.n_layers ||
        profile.d != 2 * o.n_kv_heads * o.head_dim) {
        return invalid_argument(
            "DeltaKV profile (" + std::to_string(profile.layers.size()) + " layers, D " +
            std::to_string(profile.d) + ") does not fit this model (" + std::to_string(o.n_layers) +
            " layers, D " + std::to_string(2 * o.n_kv_heads * o.head_dim) + ")");
    }
    if (o.latent_bits == 4 && (profile.int4.size() != profile.layers.size() ||
                               profile.int4_k.size() != profile.layers.size())) {
        return invalid_argument(
            "DeltaKV: the profile's int4 decoders are missing (prepare_int4_decoders)");
    }
    std::unique_ptr<DeltaKvSequenceCache> c(new DeltaKvSequenceCache(profile, o, threads));
    const int32_t kv_dim = o.n_kv_heads * o.head_dim;
    SlotPoolOptions po{static_cast<int32_t>(c->full_layers_.size()), kv_dim, o.n_ctx,
                       k::DType::kF16, o.n_kv_heads};
    DS_ASSIGN_OR_RETURN(c->full_pool_, SlotPool::create(po));
    if (!c->sparse_layers_.empty()) {
        // Room for every token in full precision (a prompt waits exact for its end:
        // expect_more); a chunk's reconstructions go to recon_k_ / recon_v_.
        SlotPoolOptions so{static_cast<int32_t>(c->sparse_layers_.size()), kv_dim, o.n_ctx,
                           k::DType::kF16, o.n_kv_heads};
        DS_ASSIGN_OR_RETURN(c->sparse_pool_, SlotPool::create(so));
    }
    return c;
}

DeltaKvSequenceCache::DeltaKvSequenceCache(const DeltaKvProfile& profile,
                                           const DeltaKvOptions& options, ThreadPool& threads)
    : profile_(profile),
      options_(options),
      threads_(&threads),
      hints_(DeltaKvHints::Options{options.pin_ratio, options.pin_after, options.pin_before,
                                   options.follow, options.follow_ahead}) {
    layer_index_.resize(static_cast<size_t>(options.n_layers));
    group_of_.assign(static_cast<size_t>(options.n_layers), -1);
    int32_t observation = -1;
    for (int32_t l = 0; l < options.n_layers; ++l) {
        if (options.full_layer[l]) {
            layer_index_[l] = static_cast<int32_t>(full_layers_.size());
            full_layers_.push_back(l);
            observation = l;
        } else {
            layer_index_[l] = static_cast<int32_t>(sparse_layers_.size());
            sparse_layers_.push_back(l);
            group_of_[l] = observation;
        }
    }
    for (int32_t l = 0; !options.full_layer[0] && l + 1 < options.n_layers; ++l) {
        if (options.full_layer[l] && !options.full_layer[l + 1]) {
            first_observation_ = l;
            break;
        }
    }
    scorer_.assign(static_cast<size_t>(options.n_layers), 0);
    for (int32_t l = 0, since_full = 0; l < options.n_layers; ++l) {
        if (options.full_layer[l]) {
            since_full = 0;
            continue;
        }
        scorer_[l] = options.score_every > 0 && since_full % options.score_every == 0;
        ++since_full;
    }
    latents_.resize(sparse_layers_.size());
    refs_.resize(sparse_layers_.size());
    pending_latents_.resize(sparse_layers_.size());
    pending_refs_.resize(sparse_layers_.size());
    pending_err_.resize(sparse_layers_.size());
    reconstructed_.assign(static_cast<size_t>(options.n_layers), 0);
    comp_end_ = options.sinks;
}

DeltaKvSequenceCache::~DeltaKvSequenceCache() {
    release_temp();
    truncate(0);
}

size_t DeltaKvSequenceCache::latent_bytes() const {
    return options_.latent_bits == 4 ? k::int4_bytes(profile_.m)
                                     : 2 * static_cast<size_t>(profile_.m);
}

void DeltaKvSequenceCache::sync_ref_list() {
    ref_list_.clear();
    for (int32_t p = options_.sinks; p < static_cast<int32_t>(ref_flag_.size()); ++p) {
        if (ref_flag_[p]) ref_list_.push_back(p);
    }
}

int32_t DeltaKvSequenceCache::n_refs_in_region() const {
    int32_t n = 0;
    for (int32_t p = options_.sinks; p < comp_end_; ++p) n += is_ref(p);
    return n;
}

Status DeltaKvSequenceCache::reserve(int32_t n_new) {
    if (n_new <= n_reserved_) return Status();
    const int32_t more = n_new - n_reserved_;
    DS_ASSIGN_OR_RETURN(std::vector<int32_t> f, full_pool_->allocate(more));
    std::vector<int32_t> s;
    if (sparse_pool_) {
        auto got = sparse_pool_->allocate(more);
        if (!got.ok()) {
            full_pool_->release(f);
            return got.status();
        }
        s = std::move(*got);
    }
    for (int32_t i = 0; i < more; ++i) {
        full_slot_.push_back(f[i]);
        sparse_slot_.push_back(sparse_pool_ ? s[i] : -1);
        latent_of_.push_back(-1);
        ref_flag_.push_back(0);
    }
    n_reserved_ = n_new;
    return Status();
}

void DeltaKvSequenceCache::store(int32_t layer, int32_t first, int32_t n, const float* kk,
                                 const float* v, int64_t ld) {
    DS_CHECK(first + n <= n_reserved_, "store past reserve");
    const int32_t kv_dim = options_.n_kv_heads * options_.head_dim;
    const bool full = options_.full_layer[layer];
    SlotPool& pool = full ? *full_pool_ : *sparse_pool_;
    const int32_t li = layer_index_[layer];
    for (int32_t i = 0; i < n; ++i) {
        const int32_t pos = n_tokens_ + first + i;
        const int32_t slot = full ? full_slot_[pos] : sparse_slot_[pos];
        write_row(k::DType::kF16, pool.k_row(li, slot), kk + i * ld, kv_dim);
        write_row(k::DType::kF16, pool.v_row(li, slot), v + i * ld, kv_dim);
    }
    if (!full && !reconstructed_[layer]) {
        // Sparse layers before the first full layer (the lead) have no observation layer: the
        // first of them takes the lead's selection for the group (lead_selection).
        if (group_of_[layer] < 0 && !lead_selected_) {
            lead_selected_ = true;
            release_temp();
            take_selection(lead_selection(), n_reserved_);
        }
        reconstruct(layer);
    }
}

kernels::KvView DeltaKvSequenceCache::view(int32_t layer, int32_t n_visible_new) const {
    const bool full = options_.full_layer[layer];
    const SlotPool& pool = full ? *full_pool_ : *sparse_pool_;
    const int32_t li = layer_index_[layer];
    k::KvView v;
    v.dtype = k::DType::kF16;
    v.k = pool.k_base(li);
    v.v = pool.v_base(li);
    v.row_stride = pool.row_bytes();
    v.head_stride = pool.head_bytes();
    if (full) {
        v.slots = full_slot_.data();
        v.n = n_tokens_ + n_visible_new;
        return v;
    }
    // Sinks, the selected part of the compressed region, the buffer, the new tokens.
    view_slots_.clear();
    for (int32_t p = 0; p < std::min(options_.sinks, n_tokens_); ++p)
        view_slots_.push_back(sparse_slot_[p]);
    view_slots_.insert(view_slots_.end(), selected_slot_.begin(), selected_slot_.end());
    // The buffer starts after the region, or right after the committed tokens while they do
    // not yet fill the sinks.
    for (int32_t p = n_tokens_ < options_.sinks ? n_tokens_ : comp_end_;
         p < n_tokens_ + n_visible_new; ++p) {
        view_slots_.push_back(sparse_slot_[p]);
    }
    v.slots = view_slots_.data();
    v.n = static_cast<int32_t>(view_slots_.size());
    return v;
}

std::vector<int32_t> DeltaKvSequenceCache::view_positions(int32_t layer,
                                                          int32_t n_visible_new) const {
    std::vector<int32_t> pos;
    const int32_t end = n_tokens_ + n_visible_new;
    if (options_.full_layer[layer]) {
        for (int32_t p = 0; p < end; ++p) pos.push_back(p);
        return pos;
    }
    for (int32_t p = 0; p < std::min(options_.sinks, n_tokens_); ++p) pos.push_back(p);
    pos.insert(pos.end(), selected_.begin(), selected_.end());
    for (int32_t p = n_tokens_ < options_.sinks ? n_tokens_ : comp_end_; p < end; ++p)
        pos.push_back(p);
    return pos;
}

kernels::KvView DeltaKvSequenceCache::reconstructed_view() const {
    k::KvView b;
    b.dtype = k::DType::kF16;
    b.k = recon_k_.data();
    b.v = recon_v_.data();
    b.row_stride = sparse_pool_ ? sparse_pool_->row_bytes() : 0;
    b.head_stride = sparse_pool_ ? sparse_pool_->head_bytes() : 0;
    b.slots = recon_slots_.data();
    b.n = static_cast<int32_t>(recon_pos_.size());
    return b;
}

void DeltaKvSequenceCache::observe(int32_t layer, const kernels::AttentionShape& shape,
                                   const float* q, int64_t ldq, const float* /*hidden*/,
                                   int64_t /*ldh*/, int32_t n, ThreadPool& pool) {
    const CallThreads call(threads_, pool);
    // What this call's commit compresses is known from positions alone: each sparse layer
    // compresses its share here, once its rows are stored and attended, so a prefill node
    // can ship the layer while later layers compute.
    if (!planned_ && !sparse_layers_.empty() && more_ == 0)
        plan_compression(n_tokens_ + n_reserved_);
    if (!options_.full_layer[layer]) {
        const int32_t sl = layer_index_[layer];
        if (!plan_blocks_.empty() && !plan_done_[sl]) compress_layer(sl);
        return;
    }
    const bool observation = options_.full_layer[layer] && layer + 1 < options_.n_layers &&
                             !options_.full_layer[layer + 1];
    if (!observation) return;
    release_temp();
    std::fill(reconstructed_.begin(), reconstructed_.end(), 0);
    const int32_t r0 = options_.sinks, r1 = comp_end_;
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
        std::vector<float> qmean(static_cast<size_t>(shape.n_heads) * dim, 0.0f);
        for (int32_t i = 0; i < n; ++i) {
            for (int64_t j = 0; j < shape.n_heads * dim; ++j)
                qmean[j] += q[i * ldq + j] / static_cast<float>(n);
        }
        std::vector<const uint16_t*> rows(static_cast<size_t>(region));
        for (int32_t t = 0; t < region; ++t) {
            rows[t] = reinterpret_cast<const uint16_t*>(full_pool_->k_row(li, full_slot_[r0 + t]));
        }
        std::vector<float> score(rows.size());
        k::max_head_scores(qmean.data(), shape.n_heads, shape.n_kv_heads, dim, rows.data(), region,
                           score.data(), *threads_);
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
    const int32_t r0 = options_.sinks, region = std::max(0, comp_end_ - r0);
    std::vector<int32_t> idx;
    if (n_reserved_ == 1 && options_.score_every == 0 && last_select_end_ > r0 &&
        last_select_end_ <= comp_end_) {
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

void DeltaKvSequenceCache::load_x(int32_t sl, int32_t pos, float* x) const {
    const int32_t kv_dim = options_.n_kv_heads * options_.head_dim;
    read_row(k::DType::kF16, sparse_pool_->k_row(sl, sparse_slot_[pos]), x, kv_dim);
    read_row(k::DType::kF16, sparse_pool_->v_row(sl, sparse_slot_[pos]), x + kv_dim, kv_dim);
    k::rope_inverse(x, options_.n_kv_heads, options_.head_dim, pos, options_.rope_theta,
                    options_.rope_style);
}

int32_t DeltaKvSequenceCache::angles(int32_t pos) {
    if (angle_of_.size() <= static_cast<size_t>(pos))
        angle_of_.resize(static_cast<size_t>(pos) + 1, -1);
    if (angle_of_[pos] < 0) {
        const int half = options_.head_dim / 2;
        angle_of_[pos] = static_cast<int32_t>(angle_table_.size());
        angle_pos_.push_back(pos);
        angle_table_.resize(angle_table_.size() + 2 * half);
        float* a = angle_table_.data() + angle_of_[pos];
        k::rope_angles(pos, options_.head_dim, options_.rope_theta, a, a + half);
    }
    return angle_of_[pos];
}

void DeltaKvSequenceCache::gather_refs(int32_t sl, const std::vector<int32_t>& positions,
                                       int32_t dims) {
    const int32_t d = profile_.d, kv_dim = d / 2, half = options_.head_dim / 2;
    const size_t lb = latent_bytes();
    latent_ptrs_.clear();
    for (int32_t p : positions) {
        latent_ptrs_.push_back(latents_[sl].data() + static_cast<size_t>(latent_of_[p]) * lb);
        angles(p);
    }
    // Every reference the region's latents may name, a row per ordinal (the sinks, then the
    // region's references): a selection's tokens name nearly all of them, and a token's
    // rows are then found without a lookup.
    ref_pos_.clear();
    if (!positions.empty()) {
        for (int32_t p = 0; p < options_.sinks; ++p) ref_pos_.push_back(p);
        for (int32_t p : ref_list_) {
            if (p >= comp_end_) break;
            ref_pos_.push_back(p);
        }
    }
    for (int32_t p : ref_pos_) angles(p);
    grow(ref_x_, ref_pos_.size() * dims);
    threads_->parallel_for(static_cast<int64_t>(ref_pos_.size()), 32, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
            // The rows lie far apart in the pool: ask for a later one while this one is read.
            if (i + 4 < e) {
                prefetch_row(sparse_pool_->k_row(sl, sparse_slot_[ref_pos_[i + 4]]), 2 * kv_dim);
                if (dims == d)
                    prefetch_row(sparse_pool_->v_row(sl, sparse_slot_[ref_pos_[i + 4]]),
                                 2 * kv_dim);
            }
            float* xi = ref_x_.data() + i * dims;
            read_row(k::DType::kF16, sparse_pool_->k_row(sl, sparse_slot_[ref_pos_[i]]), xi,
                     kv_dim);
            if (dims == d) {
                read_row(k::DType::kF16, sparse_pool_->v_row(sl, sparse_slot_[ref_pos_[i]]),
                         xi + kv_dim, kv_dim);
            }
            const float* a = angle_table_.data() + angle_of_[ref_pos_[i]];
            k::rope_apply(xi, options_.n_kv_heads, options_.head_dim, a, a + half,
                          options_.rope_style, true);
        }
    });
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
    grow(recon_k_, static_cast<size_t>(n) * row);
    grow(recon_v_, static_cast<size_t>(n) * row);
    if (recon_slots_.size() < static_cast<size_t>(n)) {
        recon_slots_.resize(static_cast<size_t>(n));
        std::iota(recon_slots_.begin(), recon_slots_.end(), 0);
    }
    if (options_.latent_bits != 4) {  // fp16 latents: Dec(z) for every token at once
        grow(x_, static_cast<size_t>(n) * d);
        grow(z_, static_cast<size_t>(n) * m);
        for (int64_t i = 0; i < n; ++i)
            read_row(k::DType::kF16, latent_ptrs_[i], z_.data() + i * m, m);
        k::matmul(profile_.layers[layer].wd, z_.data(), m, n, x_.data(), d, *threads_);
    }
    // x = Dec(z) + mean of the references, RoPE on K, into the token's row of this layer's
    // reconstructions; int4 latents are decoded a block at a time so the rows stay in cache
    // until written.
    constexpr int64_t kBlock = 16;
    // A single-threaded pool hands over the whole range in one call: blocks are cut here.
    threads_->parallel_for(n, kBlock, [&](int64_t b_all, int64_t e_all) {
        thread_local std::vector<float> block;
        const bool int4 = options_.latent_bits == 4;
        for (int64_t b = b_all; b < e_all; b += kBlock) {
            const int64_t e = std::min(e_all, b + kBlock);
            if (int4) {
                block.resize(static_cast<size_t>(kBlock) * d);
                k::deltakv_decode_int4(profile_.int4[layer], latent_ptrs_.data() + b, e - b,
                                       block.data(), d);
            }
            for (int64_t i = b; i < e; ++i) {
                const int32_t pos = recon_pos_[i];
                float* xi = int4 ? block.data() + (i - b) * d : x_.data() + i * d;
                add_ref_mean(sl, pos, d, xi, nullptr);
                const float* a = angle_table_.data() + angle_of_[pos];
                k::rope_apply(xi, options_.n_kv_heads, options_.head_dim, a, a + half,
                              options_.rope_style, false);
                write_row(k::DType::kF16, recon_k_.data() + i * row, xi, kv_dim);
                write_row(k::DType::kF16, recon_v_.data() + i * row, xi + kv_dim, kv_dim);
            }
        }
    });
}

void DeltaKvSequenceCache::add_ref_mean(int32_t sl, int32_t pos, int32_t dims, float* x,
                                        int32_t* rows) const {
    const int32_t kk = options_.k;
    const uint16_t* refs = refs_[sl].data() + static_cast<size_t>(latent_of_[pos]) * kk;
    const float* rx[16];
    int32_t nr = 0;
    for (int32_t q = 0; q < kk; ++q) {
        const int32_t row = refs[q] != kNoRef ? refs[q] : -1;
        if (rows != nullptr) rows[q] = row;
        if (row >= 0) rx[nr++] = ref_x_.data() + static_cast<size_t>(row) * dims;
    }
    k::add_mean_rows(x, rx, nr, dims);
}

void DeltaKvSequenceCache::latent_scores(int32_t layer, const kernels::AttentionShape& shape,
                                         const float* q, const std::vector<int32_t>& positions) {
    const int32_t sl = layer_index_[layer];
    const int32_t m = profile_.m, kv_dim = profile_.d / 2, kk = options_.k,
                  half = options_.head_dim / 2;
    const bool int4 = options_.latent_bits == 4;
    gather_refs(sl, positions, kv_dim);
    const int64_t n = static_cast<int64_t>(positions.size());
    grow(scores_, static_cast<size_t>(shape.n_heads) * n);
    grow(lat_refs_, static_cast<size_t>(n) * kk);
    const int32_t stride = k::int4_code_stride(m);
    if (int4) grow(codes_, static_cast<size_t>(n) * stride);
    if (!int4) {  // fp16 latents: the decoder's K rows for every token at once
        grow(z_, static_cast<size_t>(n) * m);
        grow(x_, static_cast<size_t>(n) * kv_dim);
        for (int64_t i = 0; i < n; ++i)
            read_row(k::DType::kF16, latent_ptrs_[i], z_.data() + i * m, m);
        k::WeightMatrix wk = profile_.layers[layer].wd;
        wk.rows = kv_dim;
        k::matmul(wk, z_.data(), m, n, x_.data(), kv_dim, *threads_);
    }
    // A block at a time, while its rows are in cache: K = Dec_k(z) + the mean of the
    // references' K, RoPE, and every head's score.
    constexpr int64_t kBlock = 16;
    DS_CHECK(kk <= 16, "at most 16 references per latent");
    threads_->parallel_for_affine(n, kBlock, [&](int64_t b_all, int64_t e_all) {
        thread_local std::vector<float> block;
        for (int64_t b = b_all; b < e_all; b += kBlock) {
            const int64_t e = std::min(e_all, b + kBlock);
            float* rows = nullptr;
            if (!int4) {
                rows = x_.data() + b * kv_dim;
                for (int64_t i = b; i < e; ++i) {
                    const int32_t pos = positions[i];
                    float* xi = rows + (i - b) * kv_dim;
                    add_ref_mean(sl, pos, kv_dim, xi, lat_refs_.data() + i * kk);
                    const float* a = angle_table_.data() + angle_of_[pos];
                    k::rope_apply(xi, options_.n_kv_heads, options_.head_dim, a, a + half,
                                  options_.rope_style, false);
                }
            } else {
                // Each token's reference rows and angles; the decoder adds and turns them
                // while the row is in registers.
                const float* ref_rows[kBlock * 16];
                const float* angle[kBlock];
                for (int64_t i = b; i < e; ++i) {
                    const int32_t pos = positions[i];
                    const uint16_t* refs =
                        refs_[sl].data() + static_cast<size_t>(latent_of_[pos]) * kk;
                    for (int32_t r = 0; r < kk; ++r) {
                        const bool has = refs[r] != kNoRef;
                        lat_refs_[i * kk + r] = has ? refs[r] : -1;
                        ref_rows[(i - b) * kk + r] =
                            has ? ref_x_.data() + static_cast<size_t>(refs[r]) * kv_dim : nullptr;
                    }
                    angle[i - b] = angle_table_.data() + angle_of_[pos];
                }
                k::Int4KeyFinish finish;
                finish.refs = ref_rows;
                finish.k = kk;
                finish.angles = angle;
                finish.n_heads = options_.n_kv_heads;
                finish.head_dim = options_.head_dim;
                finish.style = options_.rope_style;
                block.resize(static_cast<size_t>(kBlock) * kv_dim);
                rows = block.data();
                // The codes stay for latent_attention's values.
                uint8_t* codes = codes_.data() + b * stride;
                k::int4_latent_codes(latent_ptrs_.data() + b, e - b, m, codes);
                k::deltakv_decode_int4(profile_.int4_k[layer], latent_ptrs_.data() + b, e - b, rows,
                                       kv_dim, codes, &finish);
            }
            k::head_scores(shape, q, rows, kv_dim, e - b, scores_.data() + b, n);
        }
    });
    ref_v_.resize(ref_pos_.size());
    for (size_t r = 0; r < ref_pos_.size(); ++r) {
        ref_v_[r] =
            reinterpret_cast<const uint16_t*>(sparse_pool_->v_row(sl, sparse_slot_[ref_pos_[r]]));
    }
}

bool DeltaKvSequenceCache::attend(int32_t layer, const kernels::AttentionShape& shape,
                                  const float* q, int64_t ldq, int32_t n, float* out, int64_t ldo,
                                  ThreadPool& pool) {
    const CallThreads call(threads_, pool);
    if (n > 1) return attend_chunk(layer, shape, q, ldq, n, out, ldo);
    if (options_.full_layer[layer] || latent_sel_.empty()) return false;
    DS_CHECK(n == 1, "latent tokens are selected for single-token calls only");
    const size_t heads = static_cast<size_t>(shape.n_heads);
    lse_a_.resize(heads);
    lse_b_.resize(heads);
    out_b_.resize(heads * shape.head_dim);
    k::attention(shape, view(layer, 1), q, ldq, 1, out, ldo, *threads_, lse_a_.data());
    // A scorer scores every latent token of the region, then attends its pick as the layers
    // after it do.
    const bool picks = options_.score_every > 0 && scorer_[layer];
    DS_CHECK(options_.score_every == 0 || picks || !scored_.empty(),
             "a sparse layer before its scorer");
    const std::vector<int32_t>& positions =
        options_.score_every == 0 || picks ? latent_sel_ : scored_;
    if (picks && options_.score_dims < 1.0f && options_.latent_bits == 4) {
        sketch_pick(layer, shape, q);
        latent_scores(layer, shape, q, scored_);
    } else {
        latent_scores(layer, shape, q, positions);
        if (picks) keep_top_scored(shape.n_heads);
    }
    attended_latents_ = static_cast<int32_t>(picks ? scored_.size() : positions.size());
    k::LatentTokens t;
    t.n = attended_latents_;
    t.scores = scores_.data();
    t.latents = latent_ptrs_.data();
    t.int4 = options_.latent_bits == 4;
    if (t.int4) t.codes = codes_.data();
    t.m = profile_.m;
    t.wd_v = static_cast<const float*>(profile_.layers[layer].wd.data) +
             static_cast<size_t>(profile_.d / 2) * profile_.m;
    t.refs = lat_refs_.data();
    t.ref_slots = options_.k;
    t.ref_v = ref_v_.data();
    t.n_refs = static_cast<int64_t>(ref_v_.size());
    k::latent_attention(shape, t, out_b_.data(), lse_b_.data(), *threads_);
    if (options_.follow > 0) lse_b_raw_ = lse_b_;
    add_logit_correction(layer, shape, q, ldq, 1, lse_b_.data());
    k::merge_attention(out, lse_a_.data(), out_b_.data(), lse_b_.data(), shape.n_heads,
                       shape.head_dim);
    // With scorers a step's layers attend different picks: not followed.
    if (options_.follow > 0 && options_.score_every == 0) score_follow(shape.n_heads, positions);
    return true;
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
    top_score_.assign(scores_.begin(), scores_.begin() + n);
    for (int h = 1; h < n_heads; ++h) {
        const float* sh = scores_.data() + static_cast<size_t>(h) * n;
        for (int64_t i = 0; i < n; ++i) top_score_[i] = std::max(top_score_[i], sh[i]);
    }
    pick_top();
    const int64_t want = static_cast<int64_t>(top_.size());
    // The pick's scores, latents and references to the front, in place: top_[j] >= j, so
    // nothing is overwritten before it is read.
    const int32_t kk = options_.k;
    for (int h = 0; h < n_heads; ++h) {
        for (int64_t j = 0; j < want; ++j) scores_[h * want + j] = scores_[h * n + top_[j]];
    }
    const int32_t stride = k::int4_code_stride(profile_.m);
    for (int64_t j = 0; j < want; ++j) {
        latent_ptrs_[j] = latent_ptrs_[top_[j]];
        std::copy_n(lat_refs_.begin() + static_cast<int64_t>(top_[j]) * kk, kk,
                    lat_refs_.begin() + j * kk);
        if (options_.latent_bits == 4 && top_[j] != j) {
            std::copy_n(codes_.begin() + static_cast<int64_t>(top_[j]) * stride, stride,
                        codes_.begin() + j * stride);
        }
    }
}

bool DeltaKvSequenceCache::corrects(int32_t layer) const {
    return options_.logit_correction != 0.0f && !options_.full_layer[layer] &&
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
    if (options_.full_layer[layer]) return false;
    // What the commit compresses is known from positions alone; the last chunk of a prompt
    // scores its tokens for the pins while they are still exact.
    if (!planned_ && more_ == 0) plan_compression(n_tokens_ + n_reserved_);
    const bool pins = options_.pin_ratio > 0.0f && more_ == 0;
    if (recon_pos_.empty() && !pins) return false;
    DS_CHECK(ldo == static_cast<int64_t>(shape.n_heads) * shape.head_dim,
             "chunk output rows must be packed");
    const size_t rows = static_cast<size_t>(n) * shape.n_heads;
    lse_a_.resize(rows);
    // view(): the sinks, the selection's references, the buffer and the new tokens; the
    // selection's reconstructed tokens are attended apart (every query sees all of them),
    // their lse corrected, and merged.
    k::attention(shape, view(layer, n), q, ldq, n, out, ldo, *threads_, lse_a_.data());
    if (!recon_pos_.empty()) {
        lse_b_.resize(rows);
        out_b_.resize(rows * shape.head_dim);
        k::attention(shape, reconstructed_view(), q, ldq, n, out_b_.data(), ldo, *threads_,
                     lse_b_.data(), /*causal=*/false);
        if (pins) lse_b_raw_ = lse_b_;
        add_logit_correction(layer, shape, q, ldq, n, lse_b_.data());
        k::merge_attention(out, lse_a_.data(), out_b_.data(), lse_b_.data(), static_cast<int>(rows),
                           shape.head_dim);
    }
    if (pins) score_pins(layer, shape, q, ldq, n);
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
            shift_x[o] = -lse_a_[r];
            if (!recon_pos_.empty()) shift_b[o] = lse_b_[r] - lse_b_raw_[r] - lse_a_[r];
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
    rows.resize(recon_pos_.size());
    for (size_t j = 0; j < recon_pos_.size(); ++j)
        rows[j] = reinterpret_cast<const uint16_t*>(recon_k_.data() + j * row);
    score(recon_pos_, shift_b);
    // Exact ones: the region's references a chunk attends (a reference is attended only when
    // a step's pick or the pins name it, as a latent token is) and the tokens this commit
    // compresses, still in the buffer.
    pin_pos_.assign(selected_.begin(), selected_.end());
    for (int32_t p = comp_end_; planned_ && p < plan_end_; ++p) pin_pos_.push_back(p);
    rows.resize(pin_pos_.size());
    for (size_t j = 0; j < pin_pos_.size(); ++j) {
        rows[j] =
            reinterpret_cast<const uint16_t*>(sparse_pool_->k_row(sl, sparse_slot_[pin_pos_[j]]));
    }
    score(pin_pos_, shift_x);
}

void DeltaKvSequenceCache::score_follow(int n_heads, const std::vector<int32_t>& positions) {
    const size_t nt = positions.size();
    const size_t end = static_cast<size_t>(n_tokens_ + n_reserved_);
    // A score's share of the head's attention, with the logit correction it was given, as
    // its log: the order is the weights' order, without an exp per score.
    follow_best_.resize(nt);
    for (int h = 0; h < n_heads; ++h) {
        const float shift = lse_b_[h] - lse_b_raw_[h] - lse_a_[h];
        const float* sh = scores_.data() + static_cast<size_t>(h) * nt;
        float* best = follow_best_.data();
        if (h == 0) {
            for (size_t j = 0; j < nt; ++j) best[j] = sh[j] + shift;
        } else {
            for (size_t j = 0; j < nt; ++j) best[j] = std::max(best[j], sh[j] + shift);
        }
    }
    hints_.add_follow(positions, follow_best_.data(), end);
}

void DeltaKvSequenceCache::release_temp() {
    recon_pos_.clear();
    selected_.clear();
    selected_slot_.clear();
    latent_sel_.clear();
}

void DeltaKvSequenceCache::forget_angles() {
    for (int32_t pos : angle_pos_) angle_of_[pos] = -1;
    angle_pos_.clear();
    angle_table_.clear();
}

void DeltaKvSequenceCache::commit(int32_t n) {
    DS_CHECK(n <= n_reserved_, "commit past reserve");
    n_reserved_ -= n;
    n_tokens_ += n;
    release_temp();
    const bool more = std::exchange(more_, 0) > 0;
    hints_.choose_follow();  // a single-token call chooses what the next one follows
    scored_.clear();
    lead_selected_ = false;
    std::fill(reconstructed_.begin(), reconstructed_.end(), 0);
    if (n > 1) {  // a chunk's reconstructions are not kept for the decode steps
        std::vector<uint8_t>().swap(recon_k_);
        std::vector<uint8_t>().swap(recon_v_);
    }
    if (!sparse_layers_.empty()) {
        if (planned_ && (more || plan_n_ != n_tokens_)) drop_plan();  // a partial commit
        if (!more) {
            if (!planned_) plan_compression(n_tokens_);
            finish_compression();
        }
    }
    // The last chunk of a prompt replaces the pins (none where it scored none).
    if (n > 1 && !more) hints_.choose_pins(options_.sinks, comp_end_);
}

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
        const size_t row = sparse_pool_->row_bytes();
        for (size_t i = 0; i < movers.size(); ++i) {
            from[i] = sparse_slot_[movers[i]];
            for (int32_t sl = 0; sl < static_cast<int32_t>(sparse_layers_.size()); ++sl) {
                std::memcpy(sparse_pool_->k_row(sl, (*to)[i]), sparse_pool_->k_row(sl, from[i]),
                            row);
                std::memcpy(sparse_pool_->v_row(sl, (*to)[i]), sparse_pool_->v_row(sl, from[i]),
                            row);
            }
            sparse_slot_[movers[i]] = (*to)[i];
        }
        sparse_pool_->release(from);
    }
    sparse_pool_->trim();
}

void DeltaKvSequenceCache::choose_refs(int32_t c0, int32_t c1) {
    for (int32_t p = c0; p < c1; ++p) {
        ref_flag_[p] = (p - options_.sinks) % options_.stride == 0;
        if (ref_flag_[p]) ref_list_.push_back(p);
    }
}

void DeltaKvSequenceCache::plan_compression(int32_t n_total) {
    planned_ = true;
    plan_n_ = n_total;
    plan_carry_ = exact_carry_;
    plan_end_ = comp_end_;
    plan_blocks_.clear();
    plan_tokens_.clear();
    plan_done_.assign(sparse_layers_.size(), 0);
    for (auto& p : pending_latents_) p.clear();
    for (auto& p : pending_refs_) p.clear();
    for (auto& p : pending_err_) p.clear();
    if (sparse_layers_.empty()) return;
    const size_t row = static_cast<size_t>(options_.n_kv_heads) * options_.head_dim * 2 * 2;
    const size_t saved =
        sparse_layers_.size() * (row - latent_bytes() - sizeof(uint16_t) * options_.k);
    const double target =
        options_.keep * static_cast<double>(full_fp16_bytes(
                            n_total, options_.n_layers, options_.n_kv_heads * options_.head_dim));
    // The session's bytes before this plan (planning moves no slots): one pass, not one per block.
    const size_t held = options_.keep > 0.0f && n_total - plan_end_ >= 2 * options_.window
                            ? bytes_upto(n_total)
                            : 0;
    while (n_total - plan_end_ >= 2 * options_.window) {
        // Under a keep target the buffer grows while the session fits: the room goes to the
        // most recent tokens, which draw most of the attention.
        // What the plan saves: each latent's row, less a reference position for each token
        // it keeps exact (exact_share).
        const size_t n = plan_tokens_.size(), e = exact_count(n);
        const double saves =
            static_cast<double>((n - e) * saved) - static_cast<double>(e * sizeof(int32_t));
        if (options_.keep > 0.0f && static_cast<double>(held) - saves <= target) break;
        const int32_t c0 = plan_end_, c1 = plan_end_ + options_.window;
        choose_refs(c0, c1);
        for (int32_t p = c0; p < c1; ++p) {
            if (!is_ref(p)) plan_tokens_.push_back(p);
        }
        plan_blocks_.push_back(c1);
        plan_end_ = c1;
    }
}

void DeltaKvSequenceCache::drop_plan() {
    // Reference flags past the region are only read once their block is compressed.
    for (int32_t p = comp_end_; p < plan_end_ && p < static_cast<int32_t>(ref_flag_.size()); ++p)
        ref_flag_[p] = 0;
    exact_carry_ = plan_carry_;
    sync_ref_list();
    planned_ = false;
    plan_blocks_.clear();
    plan_tokens_.clear();
    plan_end_ = comp_end_;
}

void DeltaKvSequenceCache::compress_layer(int32_t s) {
    plan_done_[s] = 1;
    const int32_t d = profile_.d, kk = options_.k;
    const size_t lb = latent_bytes();
    auto& lat = pending_latents_[s];
    auto& refs = pending_refs_[s];
    size_t next = 0;  // first token of the block in plan_tokens_
    for (int32_t c1 : plan_blocks_) {
        std::vector<int32_t> ref_pos;
        for (int32_t p = 0; p < c1; ++p) {
            if (is_ref(p)) ref_pos.push_back(p);
        }
        size_t end = next;
        while (end < plan_tokens_.size() && plan_tokens_[end] < c1) ++end;
        const int32_t* block = plan_tokens_.data() + next;
        const int64_t nb = static_cast<int64_t>(end - next);
        std::vector<float> ref_x(ref_pos.size() * d), x(static_cast<size_t>(nb) * d), rm(x.size());
        std::vector<float> z(static_cast<size_t>(nb) * profile_.m);
        std::vector<float> scratch(static_cast<size_t>(2 * nb * profile_.layers[0].w1.rows));
        // A reference's ordinal is its index in ref_pos: the sinks, then ref_list_.
        std::vector<uint16_t> chosen(static_cast<size_t>(nb) * kk);
        threads_->parallel_for(static_cast<int64_t>(ref_pos.size()), 16, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) load_x(s, ref_pos[i], ref_x.data() + i * d);
        });
        threads_->parallel_for(nb, 8, [&](int64_t b, int64_t e) {
            std::vector<int32_t> near(static_cast<size_t>(kk));
            for (int64_t i = b; i < e; ++i) {
                float* xi = x.data() + i * d;
                load_x(s, block[i], xi);
                // References at or before the token: ref_pos is sorted.
                const int n_cand = static_cast<int>(
                    std::upper_bound(ref_pos.begin(), ref_pos.end(), block[i]) - ref_pos.begin());
                const int got = k::l2_nearest(xi, ref_x.data(), n_cand, d, kk, near.data());
                float* ri = rm.data() + i * d;
                std::fill(ri, ri + d, 0.0f);
                for (int j = 0; j < kk; ++j) {
                    chosen[i * kk + j] = j < got ? static_cast<uint16_t>(near[j]) : kNoRef;
                    if (j < got) {
                        const float* rx = ref_x.data() + static_cast<size_t>(near[j]) * d;
                        for (int32_t t = 0; t < d; ++t) ri[t] += rx[t];
                    }
                }
                for (int32_t t = 0; t < d; ++t) ri[t] /= static_cast<float>(std::max(got, 1));
            }
        });
        if (nb > 0) {
            k::deltakv_encode_residual(profile_.layers[sparse_layers_[s]], x.data(), rm.data(), nb,
                                       z.data(), scratch.data(), *threads_);
        }
        const size_t at = lat.size();
        lat.resize(at + static_cast<size_t>(nb) * lb);
        for (int64_t i = 0; i < nb; ++i) {
            const float* zi = z.data() + i * profile_.m;
            if (options_.latent_bits == 4) {
                k::int4_pack(zi, profile_.m, lat.data() + at + i * lb);
            } else {
                write_row(k::DType::kF16, lat.data() + at + i * lb, zi, profile_.m);
            }
        }
        refs.insert(refs.end(), chosen.begin(), chosen.end());
        if (options_.exact_share > 0.0f && s < exact_judges())
            add_errors(s, x.data(), rm.data(), z.data(), lat.data() + at, nb);
        next = end;
    }
    // The last judge: their errors are in, and no layer's plan rows were shipped yet
    // (rows_final_end). Layers compress in order, so the later ones compress after.
    if (s + 1 == exact_judges() && plan_decided()) keep_worst_exact();
}

void DeltaKvSequenceCache::finish_compression() {
    if (plan_blocks_.empty()) {
        planned_ = false;
        return;
    }
    for (size_t sl = 0; sl < sparse_layers_.size(); ++sl) {
        if (!plan_done_[sl]) compress_layer(static_cast<int32_t>(sl));
        latents_[sl].insert(latents_[sl].end(), pending_latents_[sl].begin(),
                            pending_latents_[sl].end());
        refs_[sl].insert(refs_[sl].end(), pending_refs_[sl].begin(), pending_refs_[sl].end());
        pending_latents_[sl].clear();
        pending_refs_[sl].clear();
    }
    std::vector<int32_t> freed;
    int32_t next_latent = static_cast<int32_t>(latents_[0].size() / latent_bytes()) -
                          static_cast<int32_t>(plan_tokens_.size());
    for (int32_t p : plan_tokens_) {
        freed.push_back(sparse_slot_[p]);
        sparse_slot_[p] = -1;
        latent_of_[p] = next_latent++;
    }
    sparse_pool_->release(freed);
    comp_end_ = plan_end_;
    planned_ = false;
    plan_blocks_.clear();
    plan_tokens_.clear();
    compact();
}

void DeltaKvSequenceCache::truncate(int32_t n_keep) {
    DS_CHECK(n_keep >= 0 && n_keep <= n_tokens_, "truncate past the end");
    drop_plan();
    release_temp();
    forget_angles();
    scored_.clear();
    lead_selected_ = false;
    last_select_end_ = 0;
    hints_.clear();
    exact_carry_ = plan_carry_ = 0.0;
    const int32_t end = n_tokens_ + n_reserved_;
    std::vector<int32_t> full_freed, sparse_freed;
    int32_t first_latent = -1;
    for (int32_t p = n_keep; p < end; ++p) {
        full_freed.push_back(full_slot_[p]);
        if (sparse_slot_[p] >= 0) sparse_freed.push_back(sparse_slot_[p]);
        if (latent_of_[p] >= 0 && first_latent < 0) first_latent = latent_of_[p];
    }
    full_pool_->release(full_freed);
    full_pool_->trim();
    if (first_latent >= 0) {
        for (size_t sl = 0; sl < latents_.size(); ++sl) {
            latents_[sl].resize(static_cast<size_t>(first_latent) * latent_bytes());
            refs_[sl].resize(static_cast<size_t>(first_latent) * options_.k);
        }
    }
    full_slot_.resize(static_cast<size_t>(n_keep));
    sparse_slot_.resize(static_cast<size_t>(n_keep));
    latent_of_.resize(static_cast<size_t>(n_keep));
    ref_flag_.resize(static_cast<size_t>(n_keep));
    sync_ref_list();
    n_tokens_ = n_keep;
    n_reserved_ = 0;
    more_ = 0;
    comp_end_ = std::max(options_.sinks, std::min(comp_end_, n_keep));
    if (sparse_pool_) {
        sparse_pool_->release(sparse_freed);
        compact();
    }
}

size_t DeltaKvSequenceCache::bytes_bound(int32_t n_tokens) const {
    const size_t n = static_cast<size_t>(std::max(n_tokens, 0));
    const size_t row = static_cast<size_t>(options_.n_kv_heads) * options_.head_dim * 2 * 2;
    // Without a keep target the sparse layers keep the sinks, every stride-th token, the
    // tokens kept exact and a buffer of less than twice the window in full precision.
    const size_t exact = std::min(
        n, static_cast<size_t>(options_.sinks + 2 * options_.window) + n / options_.stride + 1 +
               static_cast<size_t>(std::ceil(options_.exact_share * static_cast<double>(n))));
    const size_t meta = 3 * sizeof(int32_t) + 1 + sizeof(int32_t);
    const size_t compressed =
        n * full_layers_.size() * row + exact * sparse_layers_.size() * row +
        (n - exact) * sparse_layers_.size() * (latent_bytes() + sizeof(uint16_t) * options_.k);
    // A keep target lets the buffer grow while the session stays under it.
    const auto target = static_cast<size_t>(
        std::ceil(options_.keep *
                  static_cast<double>(full_fp16_bytes(static_cast<int32_t>(n), options_.n_layers,
                                                      options_.n_kv_heads * options_.head_dim))));
    return std::max(compressed, target) + n * meta;
}

size_t DeltaKvSequenceCache::prefill_bytes_bound(int32_t n_tokens, int32_t n_new) const {
    const size_t row = static_cast<size_t>(options_.n_kv_heads) * options_.head_dim * 2 * 2;
    const size_t n = static_cast<size_t>(std::max(n_tokens, 0));
    const size_t fresh = std::min(n, static_cast<size_t>(std::max(n_new, 0)));
    if (sparse_layers_.empty()) return 0;
    return fresh * sparse_layers_.size() * row + n * row;
}

size_t DeltaKvSequenceCache::resident_bytes() const {
    return full_pool_->resident_bytes() + (sparse_pool_ ? sparse_pool_->resident_bytes() : 0);
}

size_t DeltaKvSequenceCache::bytes_upto(int32_t n) const {
    const size_t kv_dim = static_cast<size_t>(options_.n_kv_heads) * options_.head_dim;
    const size_t row = kv_dim * 2 * 2;  // fp16 K and V
    size_t fp_tokens = 0, latents = 0, refs = 0;
    for (int32_t p = 0; p < n; ++p) {
        fp_tokens += sparse_slot_[p] >= 0;
        latents += latent_of_[p] >= 0;
        refs += ref_flag_[p];
    }
    // Metadata: per position its slots, latent index and reference flag; ref_list_.
    return static_cast<size_t>(n) * full_layers_.size() * row +
           fp_tokens * sparse_layers_.size() * row +
           latents * sparse_layers_.size() * (latent_bytes() + sizeof(uint16_t) * options_.k) +
           static_cast<size_t>(n) * (3 * sizeof(int32_t) + 1) + refs * sizeof(int32_t);
}

}  // namespace deltaserve::kvstore
