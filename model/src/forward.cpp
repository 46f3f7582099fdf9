#include "deltaserve/model/forward.h"

#include <cmath>
#include <string>

#include "deltaserve/kernels/attention.h"
#include "deltaserve/kernels/ops.h"

namespace deltaserve::model {

namespace k = deltaserve::kernels;

Forward::Forward(const Model& model, ThreadPool& pool, kernels::Backend* backend)
    : model_(model),
      cfg_(model.config),
      pool_(pool),
      backend_(backend != nullptr ? *backend : *k::find_backend("cpu")) {}

void Forward::ensure_scratch(int64_t n) {
    if (n <= capacity_) return;
    const auto sz = [n](int64_t width) { return static_cast<size_t>(n * width); };
    x_.resize(sz(cfg_.d_model));
    xn_.resize(sz(cfg_.d_model));
    tmp_.resize(sz(cfg_.d_model));
    q_.resize(sz(cfg_.q_dim()));
    attn_.resize(sz(cfg_.q_dim()));
    k_.resize(sz(cfg_.kv_dim()));
    v_.resize(sz(cfg_.kv_dim()));
    gate_.resize(sz(cfg_.d_ff));
    up_.resize(sz(cfg_.d_ff));
    capacity_ = n;
}

Status Forward::norm_rows(const std::vector<float>& weight, const float* in, float* out,
                          int64_t n_rows) {
    const int64_t d = cfg_.d_model;
    return backend_.rms_norm_rows(in, d, weight.data(), d, n_rows, cfg_.rms_eps, out, d,
                                  exec(pool_));
}

Status Forward::run(std::span<const SequenceInput> batch, std::vector<float>& logits) {
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
    // Reserve every cache first; when one cannot take its tokens, the ones reserved before it
    // give their new slots back, so a failed batch holds nothing.
    for (size_t i = 0; i < batch.size(); ++i) {
        Status st = batch[i].cache->reserve(static_cast<int32_t>(batch[i].tokens.size()));
        if (!st.ok()) {
            for (size_t j = 0; j < i; ++j) batch[j].cache->truncate(batch[j].cache->n_tokens());
            return st;
        }
    }
    ensure_scratch(n_tokens);
    if (Status st = layers(batch, n_tokens, logits); !st.ok()) {
        for (const auto& s : batch) s.cache->truncate(s.cache->n_tokens());  // nothing kept
        return st;
    }
    for (const auto& s : batch) s.cache->commit(static_cast<int32_t>(s.tokens.size()));
    return Status();
}

Status Forward::layers(std::span<const SequenceInput> batch, int64_t n_tokens,
                       std::vector<float>& logits) {
    positions_.clear();
    int64_t row = 0;
    const int64_t d = cfg_.d_model;
    for (const auto& s : batch) {
        for (size_t i = 0; i < s.tokens.size(); ++i)
            positions_.push_back(s.cache->n_tokens() + static_cast<int32_t>(i));
        DS_RETURN_IF_ERROR(backend_.embed_rows(model_.weights.token_embd, s.tokens.data(),
                                               static_cast<int64_t>(s.tokens.size()),
                                               x_.data() + row * d, exec(pool_)));
        row += static_cast<int64_t>(s.tokens.size());
    }

    for (int32_t layer = 0; layer < cfg_.n_layers; ++layer) {
        DS_RETURN_IF_ERROR(attention_layer(layer, batch));
        DS_RETURN_IF_ERROR(ffn_layer(layer, n_tokens));
        if (observer_) observer_(layer);
    }

    // Rows whose logits are wanted, gathered into tmp_ and normalised into xn_.
    int64_t n_out = 0;
    row = 0;
    for (const auto& s : batch) {
        const int64_t n = static_cast<int64_t>(s.tokens.size());
        for (int64_t i = s.all_logits ? 0 : n - 1; i < n; ++i) {
            std::copy_n(x_.data() + (row + i) * d, d, tmp_.data() + n_out * d);
            ++n_out;
        }
        row += n;
    }
    DS_RETURN_IF_ERROR(norm_rows(model_.weights.output_norm, tmp_.data(), xn_.data(), n_out));
    logits.resize(static_cast<size_t>(n_out * cfg_.n_vocab));
    return backend_.matmul(model_.weights.output, xn_.data(), d, n_out, logits.data(), cfg_.n_vocab,
                           exec(pool_));
}

Status Forward::attention_layer(int32_t layer, std::span<const SequenceInput> batch) {
    const LayerWeights& w = model_.weights.layers[layer];
    const int64_t n = static_cast<int64_t>(positions_.size());
    const int64_t d = cfg_.d_model, qd = cfg_.q_dim(), kvd = cfg_.kv_dim();
    const k::Exec all = exec(pool_);
    DS_RETURN_IF_ERROR(norm_rows(w.attn_norm, x_.data(), xn_.data(), n));
    const k::MatmulOutput qkv[] = {
        {&w.wq, q_.data(), qd}, {&w.wk, k_.data(), kvd}, {&w.wv, v_.data(), kvd}};
    DS_RETURN_IF_ERROR(backend_.matmul_shared_input(qkv, xn_.data(), d, n, all));
    if (!w.bq.empty()) {
        for (int64_t t = 0; t < n; ++t) {
            DS_RETURN_IF_ERROR(backend_.add(q_.data() + t * qd, w.bq.data(), qd, all));
            DS_RETURN_IF_ERROR(backend_.add(k_.data() + t * kvd, w.bk.data(), kvd, all));
            DS_RETURN_IF_ERROR(backend_.add(v_.data() + t * kvd, w.bv.data(), kvd, all));
        }
    }
    if (kv_tap_) kv_tap_(layer, k_.data(), v_.data(), n, kvd);
    DS_RETURN_IF_ERROR(backend_.rope_rows(q_.data(), qd, n, cfg_.n_heads, cfg_.head_dim,
                                          positions_.data(), cfg_.rope_theta, cfg_.rope_style,
                                          all));
    DS_RETURN_IF_ERROR(backend_.rope_rows(k_.data(), kvd, n, cfg_.n_kv_heads, cfg_.head_dim,
                                          positions_.data(), cfg_.rope_theta, cfg_.rope_style,
                                          all));
    if (attention_tap_) attention_tap_(layer, xn_.data(), d, q_.data(), qd, k_.data(), kvd, n);
    k::AttentionShape shape{cfg_.n_heads, cfg_.n_kv_heads, cfg_.head_dim,
                            1.0f / std::sqrt(static_cast<float>(cfg_.head_dim))};
    // Every sequence's new rows in, then its attention and observation. A chunk's run over
    // the whole pool, one sequence after another. A batch's one-token steps run side by side,
    // one sequence per thread, when there are at least as many as threads (alone, a short
    // one would keep the other threads idle): the caches that attend themselves (DeltaKV's
    // selection, reconstruction and latent attention) as well as the views of the others.
    first_row_.clear();
    steps_.clear();
    int64_t row = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
        const int32_t ns = static_cast<int32_t>(batch[i].tokens.size());
        batch[i].cache->store(layer, 0, ns, k_.data() + row * kvd, v_.data() + row * kvd, kvd);
        first_row_.push_back(row);
        if (ns == 1) steps_.push_back(i);
        row += ns;
    }
    // Each sequence's status; a step's side-by-side runs report here.
    step_status_.assign(batch.size(), Status());
    const auto attend = [&](size_t i, ThreadPool& pool) {
        kvstore::SequenceCache& cache = *batch[i].cache;
        const int32_t ns = static_cast<int32_t>(batch[i].tokens.size());
        const float* q = q_.data() + first_row_[i] * qd;
        float* out = attn_.data() + first_row_[i] * qd;
        if (!cache.attend(layer, shape, q, qd, ns, out, qd, pool)) {
            step_status_[i] =
                attend_view({cache.view(layer, ns), q, out, ns, cache.n_tokens()}, pool);
        }
        cache.observe(layer, shape, q, qd, xn_.data() + first_row_[i] * d, d, ns, pool);
    };
    for (size_t i = 0; i < batch.size(); ++i) {
        if (batch[i].tokens.size() != 1) attend(i, pool_);
    }
    if (steps_.size() < static_cast<size_t>(pool_.size())) {
        for (size_t i : steps_) attend(i, pool_);
    } else {
        pool_.parallel_for(static_cast<int64_t>(steps_.size()), 1, [&](int64_t b, int64_t e) {
            for (int64_t j = b; j < e; ++j) attend(steps_[static_cast<size_t>(j)], one_thread_);
        });
    }
    for (const Status& st : step_status_) DS_RETURN_IF_ERROR(st);
    DS_RETURN_IF_ERROR(backend_.matmul(w.wo, attn_.data(), qd, n, tmp_.data(), d, all));
    return backend_.add(x_.data(), tmp_.data(), n * d, all);
}

Status Forward::attend_view(const ViewAttention& job, ThreadPool& pool) {
    const k::AttentionShape shape{cfg_.n_heads, cfg_.n_kv_heads, cfg_.head_dim,
                                  1.0f / std::sqrt(static_cast<float>(cfg_.head_dim))};
    const int64_t qd = cfg_.q_dim();
    if (numerics_ == AttentionNumerics::kGgml) {
        // llama.cpp's rounding, on the CPU only. ggml's cell split follows the thread count,
        // not the pool that runs it.
        k::attention_ggml(shape, job.view, job.q, qd, job.n, job.n_past, job.out, qd, pool_.size(),
                          pool);
        return Status();
    }
    return backend_.attention(shape, job.view, job.q, qd, job.n, job.out, qd, exec(pool));
}

Status Forward::ffn_layer(int32_t layer, int64_t n) {
    const LayerWeights& w = model_.weights.layers[layer];
    const int64_t d = cfg_.d_model, ff = cfg_.d_ff;
    const k::Exec all = exec(pool_);
    DS_RETURN_IF_ERROR(norm_rows(w.ffn_norm, x_.data(), xn_.data(), n));
    const k::MatmulOutput gate_up[] = {{&w.w_gate, gate_.data(), ff}, {&w.w_up, up_.data(), ff}};
    DS_RETURN_IF_ERROR(backend_.matmul_shared_input(gate_up, xn_.data(), d, n, all));
    DS_RETURN_IF_ERROR(backend_.silu_mul(gate_.data(), gate_.data(), up_.data(), n * ff, all));
    DS_RETURN_IF_ERROR(backend_.matmul(w.w_down, gate_.data(), ff, n, tmp_.data(), d, all));
    return backend_.add(x_.data(), tmp_.data(), n * d, all);
}

}  // namespace deltaserve::model
