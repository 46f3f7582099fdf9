// DeltaKV's settings: those for a keep ratio, the keep floor, their validation, and the
// int4 decoders a profile shares.
#include "deltaserve/kvstore/deltakv_cache.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace deltaserve::kvstore {

namespace k = deltaserve::kernels;

namespace {

// A latent token's bytes in one sparse layer: its latent, its references' ordinals and its
// error code.
double latent_token_bytes(const DeltaKvProfile& profile, const DeltaKvOptions& o) {
    const size_t latent =
        o.latent_bits == 4 ? k::int4_bytes(profile.m) : 2 * static_cast<size_t>(profile.m);
    return static_cast<double>(latent + sizeof(uint16_t) * o.k + 1);
}

}  // namespace

DeltaKvOptions deltakv_options_for_keep(const DeltaKvProfile& profile, float keep,
                                        DeltaKvOptions o) {
    const int32_t n_layers = o.n_layers, n_global = o.n_global_layers();
    // Full layers are global layers: a window layer keeps its window, outside the target.
    const auto can_be_full = [&](int32_t l) {
        return l >= 0 && l < n_layers && !o.full_layer[l] && !o.is_window_layer(l);
    };
    if (keep < 0.25f) {  // fewer references and a shorter buffer
        o.stride = 2 * profile.stride;
        o.window = 32;
    }
    // Bytes per token of a sparse layer over fp16 full KV, at a 2k-token context.
    const double full_token = 2.0 * 2.0 * o.n_kv_heads * o.head_dim;
    const double latent = latent_token_bytes(profile, o);
    const double n = 2048.0;
    const double s = 1.0 / o.stride + latent / full_token + (1.5 * o.window + o.sinks) / n;
    int32_t n_full = static_cast<int32_t>(std::floor((keep - s) / (1.0 - s) * n_global));
    n_full = std::clamp(n_full, 1, std::max(1, n_global));
    o.keep = keep;
    // The observation layer calibration measured, then the most sensitive layers. A profile
    // that orders only some layers (or none) falls back to the first layers.
    o.full_layer.assign(static_cast<size_t>(n_layers), 0);
    int32_t chosen = 0;
    if (can_be_full(profile.observation_layer)) {
        o.full_layer[profile.observation_layer] = 1;
        chosen = 1;
    }
    for (int32_t l : profile.sensitivity_order) {
        if (chosen >= n_full) break;
        if (can_be_full(l)) {
            o.full_layer[l] = 1;
            ++chosen;
        }
    }
    for (int32_t l = 0; l < n_layers && chosen < n_full; ++l) {
        if (can_be_full(l)) {
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
    // As bytes_upto(): per position its slots, latent index and reference flag; the ref_list.
    const double meta = 3 * sizeof(int32_t) + 1 + sizeof(int32_t) / static_cast<double>(o.stride);
    const int32_t n_global = std::max(1, o.n_global_layers());
    return (row + (n_global - 1) * sparse + meta) / (n_global * row);
}

void prepare_int4_decoders(DeltaKvProfile& profile) {
    profile.int4.clear();
    profile.int4_k.clear();
    for (const auto& layer : profile.layers) {
        if (layer.w1.data == nullptr) {  // no compressor (a window layer's)
            profile.int4.emplace_back();
            profile.int4_k.emplace_back();
            continue;
        }
        profile.int4.push_back(k::make_int4_decoder(layer));
        profile.int4_k.push_back(k::make_int4_decoder(layer, layer.d() / 2));
    }
}

Status DeltaKvOptions::validate() const {
    const auto bad = [](const std::string& what) { return invalid_argument("DeltaKV: " + what); };
    if (n_layers < 1 || n_kv_heads < 1 || head_dim < 2 || head_dim % 2 != 0)
        return bad("the model's shape (layers, KV heads, an even head_dim) is not set");
    if (!(rope_theta > 0.0f)) return bad("rope_theta must be positive");
    if (!window_layer.empty()) {
        if (static_cast<int32_t>(window_layer.size()) != n_layers ||
            std::any_of(window_layer.begin(), window_layer.end(), [](uint8_t w) { return w > 1; }))
            return bad("window_layer needs a 0 or 1 per layer");
        if (sliding_window < 1 && n_global_layers() < n_layers)
            return bad("window layers need a sliding_window of at least 1 token");
        if (!(window_rope_theta >= 0.0f)) return bad("window_rope_theta must be at least 0");
    }
    if (static_cast<int32_t>(full_layer.size()) != n_layers ||
        std::find(full_layer.begin(), full_layer.end(), 1) == full_layer.end()) {
        return bad("at least one layer must be a full-attention layer");
    }
    for (int32_t l = 0; l < n_layers; ++l) {
        if (full_layer[l] > 1 || (full_layer[l] && is_window_layer(l)))
            return bad("layer " + std::to_string(l) + " is a window layer, not a full one");
    }
    if (n_batch < 1) return bad("n_batch must be at least 1");
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

}  // namespace deltaserve::kvstore
