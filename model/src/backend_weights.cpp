#include "deltaserve/model/backend_weights.h"

#include "deltaserve/model/model.h"

namespace deltaserve::model {

namespace k = deltaserve::kernels;

BackendWeightsCache::Set BackendWeightsCache::find(const k::Backend* backend) const {
    std::lock_guard lock(mu_);
    for (const auto& [b, w] : sets_) {
        if (b == backend) return w;
    }
    return nullptr;
}

Result<BackendWeightsCache::Set> BackendWeightsCache::get(
    const k::Backend* backend, const std::function<Result<Set>()>& make) {
    std::lock_guard lock(mu_);  // held while making: an upload happens once
    for (const auto& [b, w] : sets_) {
        if (b == backend) return w;
    }
    DS_ASSIGN_OR_RETURN(Set w, make());
    sets_.emplace_back(backend, w);
    return w;
}

Result<std::shared_ptr<const BackendWeights>> BackendWeights::of(const Model& model,
                                                                 k::Backend& backend) {
    return model.on_backends.get(&backend, [&] { return make(model, backend); });
}

Result<const float*> BackendWeights::vector_on(k::Backend& backend,
                                               const std::vector<float>& host) {
    if (host.empty()) return static_cast<const float*>(nullptr);
    if (backend.host_memory()) return host.data();
    const size_t bytes = host.size() * sizeof(float);
    DS_ASSIGN_OR_RETURN(k::Buffer buf, backend.alloc(bytes));
    DS_RETURN_IF_ERROR(backend.copy_in(buf.data(), host.data(), bytes, k::Exec{}));
    const float* p = buf.f32();
    buffers_.push_back(std::move(buf));
    return p;
}

Result<std::shared_ptr<const BackendWeights>> BackendWeights::make(const Model& model,
                                                                   k::Backend& backend) {
    auto on = std::make_shared<BackendWeights>();
    const ModelWeights& w = model.weights;
    const auto upload = [&backend](const k::WeightMatrix& m) { return backend.upload_weight(m); };
    DS_ASSIGN_OR_RETURN(on->token_embd, upload(w.token_embd));
    // A tied output is the embedding's matrix: uploaded once.
    if (w.output.data == w.token_embd.data) {
        on->output = on->token_embd;
    } else {
        DS_ASSIGN_OR_RETURN(on->output, upload(w.output));
    }
    DS_ASSIGN_OR_RETURN(on->output_norm, on->vector_on(backend, w.output_norm));
    on->layers.reserve(w.layers.size());
    for (const LayerWeights& lw : w.layers) {
        LayerOnBackend l;
        DS_ASSIGN_OR_RETURN(l.attn_norm, on->vector_on(backend, lw.attn_norm));
        DS_ASSIGN_OR_RETURN(l.ffn_norm, on->vector_on(backend, lw.ffn_norm));
        DS_ASSIGN_OR_RETURN(l.bq, on->vector_on(backend, lw.bq));
        DS_ASSIGN_OR_RETURN(l.bk, on->vector_on(backend, lw.bk));
        DS_ASSIGN_OR_RETURN(l.bv, on->vector_on(backend, lw.bv));
        DS_ASSIGN_OR_RETURN(l.q_norm, on->vector_on(backend, lw.q_norm));
        DS_ASSIGN_OR_RETURN(l.k_norm, on->vector_on(backend, lw.k_norm));
        DS_ASSIGN_OR_RETURN(l.attn_post_norm, on->vector_on(backend, lw.attn_post_norm));
        DS_ASSIGN_OR_RETURN(l.ffn_post_norm, on->vector_on(backend, lw.ffn_post_norm));
        DS_ASSIGN_OR_RETURN(l.wq, upload(lw.wq));
        DS_ASSIGN_OR_RETURN(l.wk, upload(lw.wk));
        DS_ASSIGN_OR_RETURN(l.wv, upload(lw.wv));
        DS_ASSIGN_OR_RETURN(l.wo, upload(lw.wo));
        DS_ASSIGN_OR_RETURN(l.w_gate, upload(lw.w_gate));
        DS_ASSIGN_OR_RETURN(l.w_up, upload(lw.w_up));
        DS_ASSIGN_OR_RETURN(l.w_down, upload(lw.w_down));
        on->layers.push_back(l);
    }
    return std::shared_ptr<const BackendWeights>(std::move(on));
}

}  // namespace deltaserve::model
