#include "deltaserve/model/forward.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "deltaserve/kernels/attention.h"
#include "deltaserve/kernels/ops.h"

namespace deltaserve::model {

namespace k = deltaserve::kernels;

Forward::Forward(const Model& model, ThreadPool& pool, kernels::Backend* backend)
    : model_(model),
      cfg_(model.config),
      pool_(pool),
      backend_(backend != nullptr ? *backend : *k::find_backend("cpu")),
      cpu_(*k::find_backend("cpu")) {}

Status Forward::ensure_scratch(int64_t n) {
    if (n <= capacity_) return Status();
    capacity_ = 0;  // until every buffer has its new size
    const auto make = [this, n](k::Buffer& buf, int64_t width) -> Status {
        buf = k::Buffer();  // the old one goes first: device memory may not hold both
        DS_ASSIGN_OR_RETURN(buf, backend_.alloc(static_cast<size_t>(n * width) * sizeof(float)));
        return Status();
    };
    DS_RETURN_IF_ERROR(make(x_, cfg_.d_model));
    DS_RETURN_IF_ERROR(make(xn_, cfg_.d_model));
    DS_RETURN_IF_ERROR(make(tmp_, cfg_.d_model));
    DS_RETURN_IF_ERROR(make(q_, cfg_.q_dim()));
    DS_RETURN_IF_ERROR(make(attn_, cfg_.q_dim()));
    DS_RETURN_IF_ERROR(make(k_, cfg_.kv_dim()));
    DS_RETURN_IF_ERROR(make(v_, cfg_.kv_dim()));
    DS_RETURN_IF_ERROR(make(gate_, cfg_.d_ff));
    DS_RETURN_IF_ERROR(make(up_, cfg_.d_ff));
    capacity_ = n;
    return Status();
}

Result<const float*> Forward::to_host(const float* src, int64_t n, std::vector<float>& host) {
    if (on_host()) return src;
    host.resize(static_cast<size_t>(n));
    DS_RETURN_IF_ERROR(
        backend_.copy_out(host.data(), src, host.size() * sizeof(float), exec(pool_)));
    return static_cast<const float*>(host.data());
}

Status Forward::norm_rows(const float* weight, const float* in, float* out, int64_t n_rows) {
    const int64_t d = cfg_.d_model;
    return backend_.rms_norm_rows(in, d, weight, d, n_rows, cfg_.rms_eps, out, d, exec(pool_));
}

Status Forward::run(std::span<const SequenceInput> batch, std::vector<float>& logits,
                    std::vector<RowCandidates>* candidates) {
    int64_t n_tokens = 0;
    for (const auto& s : batch) {
        if (s.tokens.empty() || s.cache == nullptr)
            return invalid_argument("forward: empty sequence");
        for (int32_t t : s.tokens) {
            if (t < 0 || t >= cfg_.n_vocab) {
                return invalid_argument("token id " + std::to_string(t) +
                                        " is outside the vocabulary (" +
                                        std::to_string(cfg_.n_vocab) + ")");
            }
        }
        n_tokens += static_cast<int64_t>(s.tokens.size());
    }
    if (numerics_ == AttentionNumerics::kGgml && !on_host()) {
        return invalid_argument(
            "llama.cpp's rounding (--attention ggml) runs on the CPU only, "
            "not on the " +
            std::string(backend_.name()) + " backend");
    }
    host_caches_ = false;
    for (const auto& s : batch) {
        const k::Backend* device = s.cache->device();
        if (device != nullptr && device != &backend_) {
            return invalid_argument("forward: a KV cache in the memory of " +
                                    device->description() + " in a pass on the " +
                                    std::string(backend_.name()) + " backend");
        }
        host_caches_ = host_caches_ || device == nullptr;
    }
    if (!weights_) {
        DS_ASSIGN_OR_RETURN(weights_, BackendWeights::of(model_, backend_));
    }
    DS_RETURN_IF_ERROR(ensure_scratch(n_tokens));
    // Reserve every cache first; when one cannot take its tokens, the ones reserved before it
    // give their new slots back, so a failed batch holds nothing.
    for (size_t i = 0; i < batch.size(); ++i) {
        Status st = batch[i].cache->reserve(static_cast<int32_t>(batch[i].tokens.size()));
        if (!st.ok()) {
            for (size_t j = 0; j < i; ++j) batch[j].cache->truncate(batch[j].cache->n_tokens());
            return st;
        }
    }
    if (Status st = layers(batch, n_tokens, logits, candidates); !st.ok()) {
        for (const auto& s : batch) s.cache->truncate(s.cache->n_tokens());  // nothing kept
        return st;
    }
    // A cache whose commit fails (a device's failure while it compresses) is back where it
    // was; so are the batch's others, the ones committed already included: nothing kept.
    for (size_t i = 0; i < batch.size(); ++i) {
        const Status st = batch[i].cache->commit(static_cast<int32_t>(batch[i].tokens.size()));
        if (st.ok()) continue;
        for (size_t j = 0; j < batch.size(); ++j) {
            kvstore::SequenceCache& c = *batch[j].cache;
            if (j < i) c.truncate(c.n_tokens() - static_cast<int32_t>(batch[j].tokens.size()));
            if (j > i) c.truncate(c.n_tokens());
        }
        return st;
    }
    return Status();
}

Status Forward::layers(std::span<const SequenceInput> batch, int64_t n_tokens,
                       std::vector<float>& logits, std::vector<RowCandidates>* candidates) {
    positions_.clear();
    int64_t row = 0;
    const int64_t d = cfg_.d_model;
    for (const auto& s : batch) {
        for (size_t i = 0; i < s.tokens.size(); ++i)
            positions_.push_back(s.cache->n_tokens() + static_cast<int32_t>(i));
        DS_RETURN_IF_ERROR(backend_.embed_rows(weights_->token_embd, s.tokens.data(),
                                               static_cast<int64_t>(s.tokens.size()),
                                               x_.f32() + row * d, exec(pool_)));
        row += static_cast<int64_t>(s.tokens.size());
    }
    if (cfg_.embedding_scale != 1.0f) {  // Gemma: times sqrt(d_model)
        DS_RETURN_IF_ERROR(
            backend_.scale(x_.f32(), cfg_.embedding_scale, n_tokens * d, exec(pool_)));
    }

    for (int32_t layer = 0; layer < cfg_.n_layers; ++layer) {
        DS_RETURN_IF_ERROR(attention_layer(layer, batch));
        DS_RETURN_IF_ERROR(ffn_layer(layer, n_tokens));
        if (observer_) observer_(layer);
    }

    // Rows whose logits are wanted, gathered into tmp_ and normalised into xn_.
    int64_t n_out = 0;
    row = 0;
    const size_t row_bytes = static_cast<size_t>(d) * sizeof(float);
    for (const auto& s : batch) {
        const int64_t n = static_cast<int64_t>(s.tokens.size());
        for (int64_t i = s.all_logits ? 0 : n - 1; i < n; ++i) {
            DS_RETURN_IF_ERROR(backend_.copy(tmp_.f32() + n_out * d, x_.f32() + (row + i) * d,
                                             row_bytes, exec(pool_)));
            ++n_out;
        }
        row += n;
    }
    DS_RETURN_IF_ERROR(norm_rows(weights_->output_norm, tmp_.f32(), xn_.f32(), n_out));
    logits.resize(static_cast<size_t>(n_out * cfg_.n_vocab));
    if (candidates != nullptr) candidates->assign(batch.size(), RowCandidates{});
    if (on_host()) {
        return backend_.matmul(weights_->output, xn_.f32(), d, n_out, logits.data(), cfg_.n_vocab,
                               exec(pool_));
    }
    const size_t logit_bytes = logits.size() * sizeof(float);
    if (logits_.bytes() < logit_bytes) {
        logits_ = k::Buffer();
        DS_ASSIGN_OR_RETURN(logits_, backend_.alloc(logit_bytes));
    }
    DS_RETURN_IF_ERROR(backend_.matmul(weights_->output, xn_.f32(), d, n_out, logits_.f32(),
                                       cfg_.n_vocab, exec(pool_)));
    return logits_out(batch, n_out, logits, candidates);
}

Status Forward::attention_layer(int32_t layer, std::span<const SequenceInput> batch) {
    const LayerOnBackend& w = weights_->layers[static_cast<size_t>(layer)];
    const int64_t n = static_cast<int64_t>(positions_.size());
    const int64_t d = cfg_.d_model, qd = cfg_.q_dim(), kvd = cfg_.kv_dim();
    const k::Exec all = exec(pool_);
    float* const q = q_.f32();
    float* const kr = k_.f32();
    float* const v = v_.f32();
    DS_RETURN_IF_ERROR(norm_rows(w.attn_norm, x_.f32(), xn_.f32(), n));
    const k::MatmulOutput qkv[] = {{&w.wq, q, qd}, {&w.wk, kr, kvd}, {&w.wv, v, kvd}};
    DS_RETURN_IF_ERROR(backend_.matmul_shared_input(qkv, xn_.f32(), d, n, all));
    if (w.bq != nullptr) {
        for (int64_t t = 0; t < n; ++t) {
            DS_RETURN_IF_ERROR(backend_.add(q + t * qd, w.bq, qd, all));
            DS_RETURN_IF_ERROR(backend_.add(kr + t * kvd, w.bk, kvd, all));
            DS_RETURN_IF_ERROR(backend_.add(v + t * kvd, w.bv, kvd, all));
        }
    }
    if (w.q_norm != nullptr) {
        // Qwen3: each head of q and k RMS-normed on its own (rows of head_dim; q and k are
        // packed, ld = q_dim and kv_dim).
        const int64_t hd = cfg_.head_dim;
        DS_RETURN_IF_ERROR(backend_.rms_norm_rows(q, hd, w.q_norm, hd, n * cfg_.n_heads,
                                                  cfg_.rms_eps, q, hd, all));
        DS_RETURN_IF_ERROR(backend_.rms_norm_rows(kr, hd, w.k_norm, hd, n * cfg_.n_kv_heads,
                                                  cfg_.rms_eps, kr, hd, all));
    }
    if (kv_tap_) {
        DS_ASSIGN_OR_RETURN(const float* hk, to_host(kr, n * kvd, host_k_));
        DS_ASSIGN_OR_RETURN(const float* hv, to_host(v, n * kvd, host_v_));
        kv_tap_(layer, hk, hv, n, kvd);
    }
    const k::RopeParams rope = cfg_.rope(layer);
    DS_RETURN_IF_ERROR(
        backend_.rope_rows(q, qd, n, cfg_.n_heads, cfg_.head_dim, positions_.data(), rope, all));
    DS_RETURN_IF_ERROR(backend_.rope_rows(kr, kvd, n, cfg_.n_kv_heads, cfg_.head_dim,
                                          positions_.data(), rope, all));
    // The rows in the backend's memory, and (on a device backend, for caches in host memory
    // and the tap) their host copies.
    const LayerRows rows{q, kr, v, xn_.f32(), attn_.f32()};
    LayerRows host = rows;
    if (!on_host() && (host_caches_ || attention_tap_)) {
        DS_ASSIGN_OR_RETURN(host.q, to_host(q, n * qd, host_q_));
        DS_ASSIGN_OR_RETURN(host.k, to_host(kr, n * kvd, host_k_));
        DS_ASSIGN_OR_RETURN(host.v, to_host(v, n * kvd, host_v_));
        DS_ASSIGN_OR_RETURN(host.xn, to_host(xn_.f32(), n * d, host_xn_));
        host_attn_.resize(static_cast<size_t>(n * qd));
        host.attn = host_attn_.data();
    }
    if (attention_tap_) attention_tap_(layer, host.xn, d, host.q, qd, host.k, kvd, n);
    DS_RETURN_IF_ERROR(attend_caches(layer, batch, rows, host));
    DS_RETURN_IF_ERROR(backend_.matmul(w.wo, attn_.f32(), qd, n, tmp_.f32(), d, all));
    if (w.attn_post_norm != nullptr)
        DS_RETURN_IF_ERROR(norm_rows(w.attn_post_norm, tmp_.f32(), tmp_.f32(), n));
    return backend_.add(x_.f32(), tmp_.f32(), n * d, all);
}

Status Forward::attend_caches(int32_t layer, std::span<const SequenceInput> batch,
                              const LayerRows& rows, const LayerRows& host) {
    const int64_t d = cfg_.d_model, qd = cfg_.q_dim(), kvd = cfg_.kv_dim();
    k::AttentionShape shape{cfg_.n_heads, cfg_.n_kv_heads, cfg_.head_dim,
                            cfg_.attention_scale_or_default()};
    // A cache in the backend's memory gets the backend's rows; one in host memory, their host
    // copies (the same rows on the CPU backend).
    const auto rows_of = [&](size_t i) -> const LayerRows& {
        return batch[i].cache->device() != nullptr ? rows : host;
    };
    // Every sequence's new rows in, then its attention and observation. Caches on a device
    // run on this thread, on its stream, the views of those that do not attend themselves as
    // one batch (Backend::attention_batch: one launch for a decode step's sequences). Host
    // caches: a chunk's run over the whole pool, one sequence after another; a batch's
    // one-token steps side by side, one sequence per thread, when there are at least as many
    // as threads (alone, a short one would keep the other threads idle): the caches that
    // attend themselves (DeltaKV's selection, reconstruction and latent attention) as well
    // as the views of the others.
    first_row_.clear();
    steps_.clear();
    int64_t row = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
        const int32_t ns = static_cast<int32_t>(batch[i].tokens.size());
        const LayerRows& r = rows_of(i);
        DS_RETURN_IF_ERROR(
            batch[i].cache->store(layer, 0, ns, r.k + row * kvd, r.v + row * kvd, kvd));
        first_row_.push_back(row);
        if (ns == 1 && batch[i].cache->device() == nullptr) steps_.push_back(i);
        row += ns;
    }
    // Each sequence's status; a step's side-by-side runs report here.
    step_status_.assign(batch.size(), Status());
    const auto attend = [&](size_t i, ThreadPool& pool) {
        kvstore::SequenceCache& cache = *batch[i].cache;
        const LayerRows& r = rows_of(i);
        const int32_t ns = static_cast<int32_t>(batch[i].tokens.size());
        const float* qi = r.q + first_row_[i] * qd;
        float* out = r.attn + first_row_[i] * qd;
        Status& st = step_status_[i];
        const Result<bool> attended = cache.attend(layer, shape, qi, qd, ns, out, qd, pool);
        if (!attended.ok()) {
            st = attended.error();
            return;
        }
        if (!*attended)
            st = attend_view({cache.view(layer, ns), qi, out, ns, cache.n_tokens()}, pool);
        if (st.ok())
            st = cache.observe(layer, shape, qi, qd, r.xn + first_row_[i] * d, d, ns, pool);
    };
    // Caches on the device: the views of those that do not attend themselves in one batch.
    device_jobs_.clear();
    for (size_t i = 0; i < batch.size(); ++i) {
        kvstore::SequenceCache& cache = *batch[i].cache;
        if (cache.device() == nullptr) continue;
        const int32_t ns = static_cast<int32_t>(batch[i].tokens.size());
        const int64_t r = first_row_[i];
        DS_ASSIGN_OR_RETURN(const bool attended, cache.attend(layer, shape, rows.q + r * qd, qd, ns,
                                                              rows.attn + r * qd, qd, pool_));
        if (!attended) device_jobs_.push_back({cache.view(layer, ns), r, ns});
    }
    if (!device_jobs_.empty()) {
        DS_RETURN_IF_ERROR(
            backend_.attention_batch(shape, device_jobs_, rows.q, qd, rows.attn, qd, exec(pool_)));
    }
    for (size_t i = 0; i < batch.size(); ++i) {
        kvstore::SequenceCache& cache = *batch[i].cache;
        if (cache.device() == nullptr) continue;
        const int64_t r = first_row_[i];
        DS_RETURN_IF_ERROR(cache.observe(layer, shape, rows.q + r * qd, qd, rows.xn + r * d, d,
                                         static_cast<int32_t>(batch[i].tokens.size()), pool_));
    }
    for (size_t i = 0; i < batch.size(); ++i) {
        if (batch[i].tokens.size() != 1 && batch[i].cache->device() == nullptr) attend(i, pool_);
    }
    if (steps_.size() < static_cast<size_t>(pool_.size())) {
        for (size_t i : steps_) attend(i, pool_);
    } else {
        pool_.parallel_for(static_cast<int64_t>(steps_.size()), 1, [&](int64_t b, int64_t e) {
            for (int64_t j = b; j < e; ++j) attend(steps_[static_cast<size_t>(j)], one_thread_);
        });
    }
    for (const Status& st : step_status_) DS_RETURN_IF_ERROR(st);
    if (host.attn == rows.attn) return Status();
    // The host caches' attention output goes back to the backend's memory.
    for (size_t i = 0; i < batch.size(); ++i) {
        if (batch[i].cache->device() != nullptr) continue;
        const auto bytes = static_cast<size_t>(batch[i].tokens.size() * qd) * sizeof(float);
        DS_RETURN_IF_ERROR(backend_.copy_in(rows.attn + first_row_[i] * qd,
                                            host.attn + first_row_[i] * qd, bytes, exec(pool_)));
    }
    return Status();
}

Status Forward::attend_view(const ViewAttention& job, ThreadPool& pool) {
    const k::AttentionShape shape{cfg_.n_heads, cfg_.n_kv_heads, cfg_.head_dim,
                                  cfg_.attention_scale_or_default()};
    const int64_t qd = cfg_.q_dim();
    if (numerics_ == AttentionNumerics::kGgml) {
        // llama.cpp's rounding, on the CPU only. ggml's cell split follows the thread count,
        // not the pool that runs it.
        k::attention_ggml(shape, job.view, job.q, qd, job.n, job.n_past, job.out, qd, pool_.size(),
                          pool);
        return Status();
    }
    // A host cache's view on a device backend: attention on the CPU.
    k::Backend& on = on_host() ? backend_ : cpu_;
    return on.attention(shape, job.view, job.q, qd, job.n, job.out, qd, exec(pool));
}

Status Forward::ffn_layer(int32_t layer, int64_t n) {
    const LayerOnBackend& w = weights_->layers[static_cast<size_t>(layer)];
    const int64_t d = cfg_.d_model, ff = cfg_.d_ff;
    const k::Exec all = exec(pool_);
    DS_RETURN_IF_ERROR(norm_rows(w.ffn_norm, x_.f32(), xn_.f32(), n));
    const k::MatmulOutput gate_up[] = {{&w.w_gate, gate_.f32(), ff}, {&w.w_up, up_.f32(), ff}};
    DS_RETURN_IF_ERROR(backend_.matmul_shared_input(gate_up, xn_.f32(), d, n, all));
    if (cfg_.gelu_ffn) {  // Gemma's GeGLU
        DS_RETURN_IF_ERROR(backend_.gelu_mul(gate_.f32(), gate_.f32(), up_.f32(), n * ff, all));
    } else {
        DS_RETURN_IF_ERROR(backend_.silu_mul(gate_.f32(), gate_.f32(), up_.f32(), n * ff, all));
    }
    DS_RETURN_IF_ERROR(backend_.matmul(w.w_down, gate_.f32(), ff, n, tmp_.f32(), d, all));
    if (w.ffn_post_norm != nullptr)
        DS_RETURN_IF_ERROR(norm_rows(w.ffn_post_norm, tmp_.f32(), tmp_.f32(), n));
    return backend_.add(x_.f32(), tmp_.f32(), n * d, all);
}

}  // namespace deltaserve::model
