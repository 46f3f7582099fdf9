// DeltaKV's sequence cache: its creation, the positions' slots in its pools, storing and
// viewing rows, commit and truncate, and the bytes it holds. Its other parts: the options
// (deltakv_options.cpp), selection (deltakv_select.cpp), attention over compressed tokens
// (deltakv_attend.cpp), compression (deltakv_compress.cpp, deltakv_exact.cpp), the hints
// (deltakv_hints.cpp), the region and plan (deltakv_region.cpp), and its codec
// (deltakv_codec.h: deltakv_shipping.cpp, deltakv_rows.cpp).
#include "deltaserve/kvstore/deltakv_cache.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "deltakv_codec.h"
#include "deltakv_scratch.h"
#include "deltaserve/kvstore/kv_layer_groups.h"
#include "row_io.h"

namespace deltaserve::kvstore {

namespace k = deltaserve::kernels;

namespace {

int32_t n_sparse_layers(const DeltaKvOptions& o) {
    return o.n_global_layers() -
           static_cast<int32_t>(std::count(o.full_layer.begin(), o.full_layer.end(), uint8_t{1}));
}

// The profile's compressors as `backend`'s ops read them: uploaded the first time a session
// runs there, shared after (the CPU backend reads the profile's own).
Result<std::shared_ptr<const DeltaKvOnBackend>> on_backend(const DeltaKvProfile& profile,
                                                           k::Backend& backend, bool int4) {
    std::lock_guard lock(profile.uploads->mu);
    for (const auto& on : profile.uploads->on) {
        if (on->backend == &backend && on->dec.size() == (int4 ? profile.layers.size() : 0))
            return on;
    }
    auto on = std::make_shared<DeltaKvOnBackend>();
    on->backend = &backend;
    for (size_t l = 0; l < profile.layers.size(); ++l) {
        const k::DeltaKvLayer& w = profile.layers[l];
        if (!profile.has_compressor(static_cast<int32_t>(l))) {  // (a window layer's: none)
            on->enc.emplace_back();
            on->wd_v.push_back(nullptr);
            if (int4) {
                on->dec.emplace_back();
                on->dec_k.emplace_back();
            }
            continue;
        }
        k::DeltaKvLayer e = w;
        DS_ASSIGN_OR_RETURN(e.w1, backend.upload_weight(w.w1));
        DS_ASSIGN_OR_RETURN(e.w2, backend.upload_weight(w.w2));
        DS_ASSIGN_OR_RETURN(e.w3, backend.upload_weight(w.w3));
        on->enc.push_back(e);
        // Dec's V rows: its rows kv_dim .. D.
        k::WeightMatrix v = w.wd;
        v.rows = w.d() / 2;
        v.data = static_cast<const float*>(w.wd.data) + static_cast<size_t>(v.rows) * w.m();
        DS_ASSIGN_OR_RETURN(k::WeightMatrix v_on, backend.upload_weight(v));
        on->wd_v.push_back(static_cast<const float*>(v_on.data));
        if (!int4) continue;
        DS_ASSIGN_OR_RETURN(k::Int4DecoderRef whole, backend.upload_int4_decoder(profile.int4[l]));
        DS_ASSIGN_OR_RETURN(k::Int4DecoderRef keys, backend.upload_int4_decoder(profile.int4_k[l]));
        on->dec.push_back(whole);
        on->dec_k.push_back(keys);
    }
    profile.uploads->on.push_back(on);
    return std::shared_ptr<const DeltaKvOnBackend>(std::move(on));
}

}  // namespace

Result<std::unique_ptr<DeltaKvSequenceCache>> DeltaKvSequenceCache::create(
    const DeltaKvProfile& profile, const DeltaKvOptions& o, ThreadPool& threads,
    k::Backend* device) {
    DS_RETURN_IF_ERROR(o.validate());
    if (static_cast<int32_t>(profile.layers.size()) != o.n_layers ||
        profile.d != 2 * o.n_kv_heads * o.head_dim) {
        return invalid_argument(
            "DeltaKV profile (" + std::to_string(profile.layers.size()) + " layers, D " +
            std::to_string(profile.d) + ") does not fit this model (" + std::to_string(o.n_layers) +
            " layers, D " + std::to_string(2 * o.n_kv_heads * o.head_dim) + ")");
    }
    for (int32_t l = 0; l < o.n_layers; ++l) {
        if (!o.full_layer[l] && !o.is_window_layer(l) && !profile.has_compressor(l)) {
            return invalid_argument("DeltaKV profile has no compressor for layer " +
                                    std::to_string(l) + ", which these options compress");
        }
    }
    if (o.latent_bits == 4 && (profile.int4.size() != profile.layers.size() ||
                               profile.int4_k.size() != profile.layers.size())) {
        return invalid_argument(
            "DeltaKV: the profile's int4 decoders are missing (prepare_int4_decoders)");
    }
    if (device != nullptr && device->host_memory()) device = nullptr;
    if (device != nullptr && o.latent_bits != 4) {
        return invalid_argument(
            "DeltaKV: a profile of fp16 latents runs on the CPU only, "
            "not on " +
            device->description());
    }
    std::unique_ptr<DeltaKvSequenceCache> c(new DeltaKvSequenceCache(profile, o, threads));
    // The ops run on the device whose memory holds the cache, else on the CPU backend.
    c->device_ = device;
    c->backend_ = device != nullptr ? device : k::find_backend("cpu");
    DS_CHECK(c->backend_ != nullptr, "the CPU backend is always registered");
    // A pool of fp16 rows per layer, for every position (in host memory address space only).
    const auto pool_of = [&](size_t n_layers) {
        return SlotPool::create(SlotPoolOptions{static_cast<int32_t>(n_layers),
                                                o.n_kv_heads * o.head_dim, o.n_ctx, k::DType::kF16,
                                                o.n_kv_heads, device});
    };
    DS_ASSIGN_OR_RETURN(c->full_pool_, pool_of(c->full_layers_.size()));
    if (!c->sparse_layers_.empty()) {
        // Room for every token in full precision (a prompt waits exact for its end:
        // expect_more); a chunk's reconstructions go to recon_k_ / recon_v_.
        DS_ASSIGN_OR_RETURN(c->sparse_pool_, pool_of(c->sparse_layers_.size()));
    }
    if (!c->window_layers_.empty()) {
        // Address space for every position; rows past the window go back to the pool and are
        // taken again (lowest first), so what is in memory is the window and the chunk.
        DS_ASSIGN_OR_RETURN(c->window_pool_, pool_of(c->window_layers_.size()));
    }
    DS_ASSIGN_OR_RETURN(c->on_, on_backend(profile, *c->backend_, o.latent_bits == 4));
    c->enc_ = &c->on_->enc;
    c->dec_ = &c->on_->dec;
    c->dec_k_ = &c->on_->dec_k;
    for (auto* a :
         {&c->ref_x_, &c->scores_, &c->out_b_, &c->lse_a_, &c->lse_b_, &c->sel_q_, &c->sel_scores_,
          &c->enc_ref_x_, &c->enc_x_, &c->enc_rm_, &c->enc_z_, &c->angles_on_})
        a->bind(device);
    for (auto* a : {&c->recon_k_, &c->recon_v_, &c->codes_, &c->enc_latents_}) a->bind(device);
    c->enc_refs_.bind(device);
    const size_t n_sparse = c->sparse_layers_.size();
    c->latents_on_.resize(n_sparse);
    c->refs_on_.resize(n_sparse);
    c->latents_synced_.assign(n_sparse, 0);
    c->refs_synced_.assign(n_sparse, 0);
    for (size_t sl = 0; sl < n_sparse; ++sl) {
        c->latents_on_[sl].bind(device);
        c->refs_on_[sl].bind(device);
    }
    return c;
}

DeltaKvSequenceCache::DeltaKvSequenceCache(const DeltaKvProfile& profile,
                                           const DeltaKvOptions& options, ThreadPool& threads)
    : profile_(profile),
      options_(options),
      threads_(&threads),
      region_(options.sinks, options.stride, n_sparse_layers(options)),
      plan_(n_sparse_layers(options)),
      hints_(DeltaKvHints::Options{options.pin_ratio, options.pin_after, options.pin_before,
                                   options.follow, options.follow_ahead}),
      codec_(std::make_unique<DeltaKvCodec>(*this)) {
    layer_index_.resize(static_cast<size_t>(options.n_layers));
    group_of_.assign(static_cast<size_t>(options.n_layers), -1);
    observes_.assign(static_cast<size_t>(options.n_layers), 0);
    int32_t observation = -1;
    std::vector<int32_t> global;  // the layers full_layer chooses among, in order
    for (int32_t l = 0; l < options.n_layers; ++l) {
        if (options.is_window_layer(l)) {
            layer_index_[l] = static_cast<int32_t>(window_layers_.size());
            window_layers_.push_back(l);
            continue;
        }
        global.push_back(l);
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
    // A full layer observes for the sparse layers after it: those up to the next full one
    // (window layers between them take no part).
    for (size_t i = 0; i + 1 < global.size(); ++i) {
        observes_[global[i]] = options.full_layer[global[i]] && !options.full_layer[global[i + 1]];
        if (observes_[global[i]] && first_observation_ < 0 && !options.full_layer[global[0]])
            first_observation_ = global[i];
    }
    scorer_.assign(static_cast<size_t>(options.n_layers), 0);
    for (int32_t l = 0, since_full = 0; l < options.n_layers; ++l) {
        if (options.is_window_layer(l)) continue;
        if (options.full_layer[l]) {
            since_full = 0;
            continue;
        }
        scorer_[l] = options.score_every > 0 && since_full % options.score_every == 0;
        ++since_full;
    }
    reconstructed_.assign(static_cast<size_t>(options.n_layers), 0);
}

SequenceCodec* DeltaKvSequenceCache::codec() { return codec_.get(); }

DeltaKvSequenceCache::~DeltaKvSequenceCache() {
    release_temp();
    truncate(0);
}

size_t DeltaKvSequenceCache::latent_bytes() const {
    return options_.latent_bits == 4 ? k::int4_bytes(profile_.m)
                                     : 2 * static_cast<size_t>(profile_.m);
}

Status DeltaKvSequenceCache::reserve(int32_t n_new) {
    if (n_new <= n_reserved_) return Status();
    drop_window_before(n_tokens_);  // this call's first query sees the window ending there
    const int32_t more = n_new - n_reserved_;
    DS_ASSIGN_OR_RETURN(std::vector<int32_t> f, full_pool_->allocate(more));
    std::vector<int32_t> s, w;
    if (sparse_pool_) {
        auto got = sparse_pool_->allocate(more);
        if (!got.ok()) {
            full_pool_->release(f);
            return got.status();
        }
        s = std::move(*got);
    }
    if (window_pool_) {
        auto got = window_pool_->allocate(more);
        if (!got.ok()) {
            full_pool_->release(f);
            if (sparse_pool_) sparse_pool_->release(s);
            return got.status();
        }
        w = std::move(*got);
    }
    for (int32_t i = 0; i < more; ++i) {
        full_slot_.push_back(f[i]);
        sparse_slot_.push_back(sparse_pool_ ? s[i] : -1);
        window_slot_.push_back(window_pool_ ? w[i] : -1);
        region_.add_position();
    }
    n_reserved_ = n_new;
    return Status();
}

void DeltaKvSequenceCache::drop_window_before(int32_t from) {
    if (!window_pool_) return;
    const int32_t upto = std::min(static_cast<int32_t>(window_slot_.size()),
                                  std::max(0, from - options_.sliding_window + 1 - kWindowSlack));
    std::vector<int32_t> freed;
    for (int32_t p = window_from_; p < upto; ++p) {
        if (window_slot_[p] >= 0) freed.push_back(std::exchange(window_slot_[p], -1));
    }
    window_pool_->release(freed);
    window_from_ = std::max(window_from_, upto);
}

Status DeltaKvSequenceCache::store(int32_t layer, int32_t first, int32_t n, const float* kk,
                                   const float* v, int64_t ld) {
    DS_CHECK(first + n <= n_reserved_, "store past reserve");
    if (options_.is_window_layer(layer)) {
        return window_pool_->store(
            layer_index_[layer],
            std::span<const int32_t>(window_slot_)
                .subspan(static_cast<size_t>(n_tokens_ + first), static_cast<size_t>(n)),
            kk, v, ld);
    }
    const bool full = options_.full_layer[layer];
    SlotPool& pool = full ? *full_pool_ : *sparse_pool_;
    const std::vector<int32_t>& slot_of = full ? full_slot_ : sparse_slot_;
    DS_RETURN_IF_ERROR(
        pool.store(layer_index_[layer],
                   std::span<const int32_t>(slot_of).subspan(static_cast<size_t>(n_tokens_ + first),
                                                             static_cast<size_t>(n)),
                   kk, v, ld));
    if (!full && !reconstructed_[layer]) {
        // Sparse layers before the first full layer (the lead) have no observation layer: the
        // first of them takes the lead's selection for the group (lead_selection).
        if (group_of_[layer] < 0 && !lead_selected_) {
            lead_selected_ = true;
            release_temp();
            take_selection(lead_selection(), n_reserved_);
        }
        try {
            reconstruct(layer);
        } catch (const OpFailure& f) {
            return f.status;
        }
    }
    return Status();
}

kernels::KvView DeltaKvSequenceCache::view(int32_t layer, int32_t n_visible_new) const {
    if (options_.is_window_layer(layer)) {  // the positions held, each query its window
        k::KvView v;
        v.dtype = k::DType::kF16;
        v.k = window_pool_->k_base(layer_index_[layer]);
        v.v = window_pool_->v_base(layer_index_[layer]);
        v.row_stride = window_pool_->row_bytes();
        v.head_stride = window_pool_->head_bytes();
        v.slots = window_slot_.data() + window_from_;
        v.n = n_tokens_ + n_visible_new - window_from_;
        v.window = options_.sliding_window;
        return v;
    }
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
    for (int32_t p = n_tokens_ < options_.sinks ? n_tokens_ : region_.end;
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
    if (options_.full_layer[layer] || options_.is_window_layer(layer)) {
        for (int32_t p = options_.full_layer[layer] ? 0 : window_from_; p < end; ++p)
            pos.push_back(p);
        return pos;
    }
    for (int32_t p = 0; p < std::min(options_.sinks, n_tokens_); ++p) pos.push_back(p);
    pos.insert(pos.end(), selected_.begin(), selected_.end());
    for (int32_t p = n_tokens_ < options_.sinks ? n_tokens_ : region_.end; p < end; ++p)
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
    angles_synced_ = 0;
}

Status DeltaKvSequenceCache::commit(int32_t n) {
    const int32_t before = n_tokens_;
    try {
        commit_call(n);
    } catch (const OpFailure& f) {
        truncate(before);  // the turn's rows, and the compression it was making, go
        return f.status;
    }
    return Status();
}

void DeltaKvSequenceCache::commit_call(int32_t n) {
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
        recon_k_.release();
        recon_v_.release();
    }
    if (!sparse_layers_.empty()) {
        if (plan_.active && (more || plan_.n_total != n_tokens_)) drop_plan();  // a partial commit
        if (!more) {
            if (!plan_.active) plan_compression(n_tokens_);
            finish_compression();
        }
    }
    // The last chunk of a prompt replaces the pins (none where it scored none).
    if (n > 1 && !more) hints_.choose_pins(options_.sinks, region_.end);
}

void DeltaKvSequenceCache::truncate(int32_t n_keep) {
    DS_CHECK(n_keep >= 0 && n_keep <= n_tokens_, "truncate past the end");
    n_keep = kept_by_truncate(n_keep);
    drop_plan();
    release_temp();
    forget_angles();
    scored_.clear();
    lead_selected_ = false;
    last_select_end_ = 0;
    hints_.clear();
    plan_.exact_carry = plan_.carry_before = 0.0;
    const int32_t end = n_tokens_ + n_reserved_;
    std::vector<int32_t> full_freed, sparse_freed, window_freed;
    for (int32_t p = n_keep; p < end; ++p) {
        full_freed.push_back(full_slot_[p]);
        if (sparse_slot_[p] >= 0) sparse_freed.push_back(sparse_slot_[p]);
        if (window_slot_[p] >= 0) window_freed.push_back(window_slot_[p]);
    }
    if (window_pool_) {
        window_pool_->release(window_freed);
        window_pool_->trim();
    }
    window_slot_.resize(static_cast<size_t>(n_keep));
    if (n_keep == 0) window_from_ = 0;
    full_pool_->release(full_freed);
    full_pool_->trim();
    region_.truncate(n_keep, latent_bytes(), options_.k);
    for (size_t sl = 0; sl < sparse_layers_.size(); ++sl) {  // what later latents overwrite
        latents_synced_[sl] = std::min(latents_synced_[sl], region_.latents[sl].size());
        refs_synced_[sl] = std::min(refs_synced_[sl], region_.refs[sl].size());
    }
    full_slot_.resize(static_cast<size_t>(n_keep));
    sparse_slot_.resize(static_cast<size_t>(n_keep));
    n_tokens_ = n_keep;
    n_reserved_ = 0;
    more_ = 0;
    if (sparse_pool_) {
        sparse_pool_->release(sparse_freed);
        compact();
    }
}

int32_t DeltaKvSequenceCache::kept_by_truncate(int32_t n_keep) const {
    if (window_from_ == 0 || n_keep >= n_tokens_) return n_keep;
    return std::max(0, n_keep - options_.sliding_window + 1) >= window_from_ ? n_keep : 0;
}

size_t DeltaKvSequenceCache::window_bytes() const {
    if (!window_pool_) return 0;
    return static_cast<size_t>(std::max(0, n_tokens_ - window_from_)) * window_layers_.size() * 2 *
           window_pool_->row_bytes();
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
    const auto target = static_cast<size_t>(std::ceil(
        options_.keep *
        static_cast<double>(full_fp16_bytes(static_cast<int32_t>(n), options_.n_global_layers(),
                                            options_.n_kv_heads * options_.head_dim))));
    // A window layer holds its window, the slack and the chunk a forward call brings.
    const size_t window_rows =
        std::min(n, static_cast<size_t>(options_.sliding_window - 1 + kWindowSlack +
                                        std::min(options_.n_batch, n_tokens)));
    return std::max(compressed, target) + n * meta + window_rows * window_layers_.size() * row;
}

size_t DeltaKvSequenceCache::prefill_bytes_bound(int32_t n_tokens, int32_t n_new) const {
    const size_t row = static_cast<size_t>(options_.n_kv_heads) * options_.head_dim * 2 * 2;
    const size_t n = static_cast<size_t>(std::max(n_tokens, 0));
    const size_t fresh = std::min(n, static_cast<size_t>(std::max(n_new, 0)));
    if (sparse_layers_.empty()) return 0;
    return fresh * sparse_layers_.size() * row + n * row;
}

size_t DeltaKvSequenceCache::resident_bytes() const {
    return full_pool_->resident_bytes() + (sparse_pool_ ? sparse_pool_->resident_bytes() : 0) +
           (window_pool_ ? window_pool_->resident_bytes() : 0);
}

size_t DeltaKvSequenceCache::bytes_upto(int32_t n) const {
    const size_t kv_dim = static_cast<size_t>(options_.n_kv_heads) * options_.head_dim;
    const size_t row = kv_dim * 2 * 2;  // fp16 K and V
    size_t fp_tokens = 0, latents = 0, refs = 0;
    for (int32_t p = 0; p < n; ++p) {
        fp_tokens += sparse_slot_[p] >= 0;
        latents += region_.latent_of[p] >= 0;
        refs += region_.ref_flag[p];
    }
    // Metadata: per position its slots, latent index and reference flag; region_.ref_list.
    return static_cast<size_t>(n) * full_layers_.size() * row +
           fp_tokens * sparse_layers_.size() * row +
           latents * sparse_layers_.size() * (latent_bytes() + sizeof(uint16_t) * options_.k + 1) +
           static_cast<size_t>(n) * (3 * sizeof(int32_t) + 1) + refs * sizeof(int32_t);
}

}  // namespace deltaserve::kvstore
