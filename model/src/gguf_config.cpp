// GGUF hyperparameters: every key under the architecture's prefix is read, known to change
// nothing, or refused by name. llama.cpp's llama-model.cpp reads them the same way.
#include "gguf_config.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>

namespace deltaserve::model {

namespace {

constexpr GgufArch kArchs[] = {
    {"llama", kernels::RopeStyle::kInterleaved, true, false, false},
    {"mistral", kernels::RopeStyle::kInterleaved, true, false, false},
    // llama.cpp keeps the Hugging Face layout for these and uses NeoX (split-half) RoPE.
    {"qwen2", kernels::RopeStyle::kSplitHalf, false, false, false},
    {"qwen3", kernels::RopeStyle::kSplitHalf, false, true, false},
    {"gemma3", kernels::RopeStyle::kSplitHalf, false, true, true},
};

// Keys read below.
constexpr std::string_view kRead[] = {
    "context_length",
    "embedding_length",
    "block_count",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.layer_norm_rms_epsilon",
    "attention.key_length",
    "attention.value_length",
    "rope.freq_base",
    "rope.dimension_count",
    "rope.scaling.type",
    "rope.scaling.factor",
    "rope.scale_linear",
    "vocab_size",
};

// Keys read for Gemma 3 only.
constexpr std::string_view kReadGemma[] = {
    "attention.sliding_window",
    "rope.freq_base_swa",
};

// Keys that change nothing here: YaRN's original context (YaRN is refused), a flag, and the
// layout note old converters wrote (llama.cpp reads none of them).
constexpr std::string_view kNoEffect[] = {
    "rope.scaling.original_context_length",
    "rope.scaling.finetuned",
    "tensor_data_layout",
};

// Keys whose mere presence means a graph deltaserve does not compute, with what it is.
// A count of 0 (experts) is the dense graph and allowed.
struct Refused {
    std::string_view key;
    std::string_view what;
    bool zero_allowed;
};
constexpr Refused kRefused[] = {
    {"attn_logit_softcapping", "attention logit softcapping", false},
    {"final_logit_softcapping", "final logit softcapping", false},
    {"attention.sliding_window", "sliding-window attention", false},
    {"expert_count", "a mixture of experts", true},
    {"expert_used_count", "a mixture of experts", true},
    {"expert_shared_count", "shared experts", true},
    {"attention.layer_norm_epsilon", "LayerNorm (not RMSNorm)", false},
    {"attention.causal", "non-causal attention", false},
    {"pooling_type", "an embedding model's pooling", false},
    {"rope.dimension_sections", "multi-section RoPE", false},
    {"rope.scaling.attn_factor", "a scaled RoPE attention factor", false},
    {"embedding_scale", "a scaled embedding", false},
    {"residual_scale", "scaled residuals", false},
    {"logit_scale", "scaled logits", false},
    {"attention.scale", "an attention scale of its own", false},
    {"attention.q_lora_rank", "low-rank attention (MLA)", false},
    {"attention.kv_lora_rank", "low-rank attention (MLA)", false},
};

template <size_t N>
bool listed(const std::string_view (&keys)[N], std::string_view k) {
    for (std::string_view x : keys) {
        if (x == k) return true;
    }
    return false;
}

Status check_keys(const GgufFile& g, const GgufArch& arch) {
    const std::string a = arch.name;
    const std::string prefix = a + ".";
    for (const auto& [key, value] : g.metadata()) {
        if (key.compare(0, prefix.size(), prefix) != 0) continue;
        const std::string_view k = std::string_view(key).substr(prefix.size());
        if (listed(kRead, k) || listed(kNoEffect, k) || (arch.gemma && listed(kReadGemma, k)))
            continue;
        bool refused_here = true;
        std::string what = "a key deltaserve does not implement (it may change the result)";
        for (const Refused& r : kRefused) {
            if (r.key != k) continue;
            what = std::string(r.what) + " is not implemented";
            const bool is_count = value.type != GgufType::kArray && value.type != GgufType::kString;
            refused_here = !(r.zero_allowed && is_count && value.f == 0.0);
        }
        if (refused_here) return unimplemented(g.path() + ": " + key + ": " + what);
    }
    return Status();
}

Result<int32_t> hparam(const GgufFile& g, const std::string& arch, const char* key) {
    DS_ASSIGN_OR_RETURN(int64_t v, g.get_int(arch + "." + key));
    if (v <= 0 || v > (1ll << 30)) {
        return invalid_argument(g.path() + ": " + arch + "." + key + " = " + std::to_string(v) +
                                " is out of range");
    }
    return static_cast<int32_t>(v);
}

// An optional number; `fallback` when absent, an error when of another type or not finite.
Result<double> number(const GgufFile& g, const std::string& key, double fallback) {
    if (!g.has(key)) return fallback;
    DS_ASSIGN_OR_RETURN(double v, g.get_float(key));
    if (!std::isfinite(v)) {
        return invalid_argument(g.path() + ": " + key + " = " + std::to_string(v) +
                                " is not finite");
    }
    return v;
}

// rope.scaling.type (llama.cpp's default: linear) and its factor (rope.scaling.factor, or
// the older rope.scale_linear; 0 or absent: 1). "none" never scales.
Status read_rope_scaling(const GgufFile& g, const std::string& a, ModelConfig& c) {
    std::string type = "linear";
    if (g.has(a + ".rope.scaling.type")) {
        DS_ASSIGN_OR_RETURN(type, g.get_string(a + ".rope.scaling.type"));
    }
    const std::string factor_key =
        g.has(a + ".rope.scaling.factor") ? a + ".rope.scaling.factor" : a + ".rope.scale_linear";
    DS_ASSIGN_OR_RETURN(double factor, number(g, factor_key, 0.0));
    if (factor == 0.0) factor = 1.0;
    if (!(factor > 0.0 && factor < 1e6)) {
        return invalid_argument(g.path() + ": " + factor_key + " = " + std::to_string(factor) +
                                " is out of range");
    }
    if (type == "none") return Status();
    if (type == "yarn" || type == "longrope") {
        return unimplemented(g.path() + ": " + a + ".rope.scaling.type = " + type +
                             ": this RoPE scaling is not implemented (none, linear and llama3's "
                             "rope_freqs are)");
    }
    if (type != "linear") {
        return unimplemented(g.path() + ": " + a + ".rope.scaling.type = '" + type +
                             "' is not a RoPE scaling deltaserve knows");
    }
    if (factor != 1.0) {
        c.rope_scaling = "linear";
        c.rope_freq_scale = static_cast<float>(1.0 / factor);
    }
    return Status();
}

// The head size: attention.key_length when given (Qwen3's differs from d_model / n_heads),
// else d_model / n_heads; one size for keys and values.
Status read_heads(const GgufFile& g, const std::string& a, ModelConfig& c) {
    DS_ASSIGN_OR_RETURN(c.n_heads, hparam(g, a, "attention.head_count"));
    c.n_kv_heads = c.n_heads;
    if (g.has(a + ".attention.head_count_kv")) {
        DS_ASSIGN_OR_RETURN(c.n_kv_heads, hparam(g, a, "attention.head_count_kv"));
    }
    if (c.n_heads % c.n_kv_heads != 0) {
        return invalid_argument(g.path() + ": " + std::to_string(c.n_heads) +
                                " heads do not share " + std::to_string(c.n_kv_heads) +
                                " KV heads evenly");
    }
    if (g.has(a + ".attention.key_length")) {
        DS_ASSIGN_OR_RETURN(c.head_dim, hparam(g, a, "attention.key_length"));
    } else if (c.d_model % c.n_heads != 0) {
        return invalid_argument(
            g.path() + ": " + std::to_string(c.n_heads) + " heads do not divide the model width " +
            std::to_string(c.d_model) + " and attention.key_length is not given");
    } else {
        c.head_dim = c.d_model / c.n_heads;
    }
    if (g.has(a + ".attention.value_length")) {
        DS_ASSIGN_OR_RETURN(const int32_t v, hparam(g, a, "attention.value_length"));
        if (v != c.head_dim) {
            return unimplemented(g.path() + ": value heads of " + std::to_string(v) +
                                 " and key heads of " + std::to_string(c.head_dim) +
                                 " (one head size is)");
        }
    }
    if (c.head_dim % 2 != 0 || c.head_dim > 1024) {
        return invalid_argument(g.path() + ": head size " + std::to_string(c.head_dim) +
                                " (even, at most 1024: RoPE turns pairs)");
    }
    if (int64_t{c.n_heads} * c.head_dim > (1 << 30)) {
        return invalid_argument(g.path() + ": " + std::to_string(c.n_heads) + " heads of " +
                                std::to_string(c.head_dim) + " are too wide");
    }
    if (auto rot = g.get_int(a + ".rope.dimension_count"); rot && *rot != c.head_dim) {
        return unimplemented(g.path() + ": partial RoPE (rope.dimension_count " +
                             std::to_string(*rot) + " != head size " + std::to_string(c.head_dim) +
                             ")");
    }
    return Status();
}

// Gemma 3 as llama.cpp's llama-model.cpp computes it: the embedding times sqrt(d_model), GeGLU,
// post norms; with attention.sliding_window, 5 local layers of every 6 (set_swa_pattern(6))
// at RoPE base 10000 (rope.freq_base_swa when given), unscaled; queries scaled by
// 1 / sqrt(head_dim), or 1 / sqrt(d_model / n_heads) for the 62-layer 27B.
Status read_gemma3(const GgufFile& g, ModelConfig& c) {
    const std::string& a = c.arch;
    c.embedding_scale = std::sqrt(static_cast<float>(c.d_model));
    c.gelu_ffn = true;
    c.post_norms = true;
    c.attention_scale = c.n_layers == 62
                            ? 1.0f / std::sqrt(static_cast<float>(c.d_model / c.n_heads))
                            : 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    if (!g.has(a + ".attention.sliding_window")) return Status();
    DS_ASSIGN_OR_RETURN(c.sliding_window, hparam(g, a, "attention.sliding_window"));
    DS_ASSIGN_OR_RETURN(const double base, number(g, a + ".rope.freq_base_swa", 10000.0));
    if (!(base > 0.0 && base < 1e30)) {
        return invalid_argument(g.path() + ": rope.freq_base_swa = " + std::to_string(base) +
                                " is out of range");
    }
    c.rope_theta_local = static_cast<float>(base);
    c.local_pattern = 6;  // llama.cpp: il % 6 < 5 is local
    return Status();
}

}  // namespace

Result<const GgufArch*> find_gguf_arch(const GgufFile& g) {
    DS_ASSIGN_OR_RETURN(std::string arch, g.get_string("general.architecture"));
    for (const GgufArch& a : kArchs) {
        if (arch == a.name) return &a;
    }
    if (arch == "qwen3moe" || arch == "qwen2moe") {
        return unimplemented(g.path() + ": architecture '" + arch +
                             "': mixtures of experts are not supported (the dense qwen2 and "
                             "qwen3 are)");
    }
    return unimplemented(g.path() + ": architecture '" + arch +
                         "' is not supported (llama, mistral, qwen2, qwen3, gemma3 are)");
}

Status read_gguf_config(const GgufFile& g, const GgufArch& arch, ModelConfig& c) {
    c.arch = arch.name;
    const std::string& a = c.arch;
    DS_RETURN_IF_ERROR(check_keys(g, arch));
    auto name = g.get_string("general.name");
    c.name = name ? *name : g.path().substr(g.path().find_last_of('/') + 1);
    DS_ASSIGN_OR_RETURN(c.d_model, hparam(g, a, "embedding_length"));
    DS_ASSIGN_OR_RETURN(c.n_layers, hparam(g, a, "block_count"));
    DS_ASSIGN_OR_RETURN(c.d_ff, hparam(g, a, "feed_forward_length"));
    DS_RETURN_IF_ERROR(read_heads(g, a, c));
    if (g.has(a + ".context_length")) {
        DS_ASSIGN_OR_RETURN(c.n_ctx_train, hparam(g, a, "context_length"));
    }
    DS_ASSIGN_OR_RETURN(const double eps, number(g, a + ".attention.layer_norm_rms_epsilon", 1e-5));
    if (!(eps >= 0.0 && eps < 1.0)) {
        return invalid_argument(g.path() + ": attention.layer_norm_rms_epsilon = " +
                                std::to_string(eps) + " is out of range");
    }
    c.rms_eps = static_cast<float>(eps);
    DS_ASSIGN_OR_RETURN(const double base, number(g, a + ".rope.freq_base", 10000.0));
    if (!(base > 0.0 && base < 1e30)) {
        return invalid_argument(g.path() + ": rope.freq_base = " + std::to_string(base) +
                                " is out of range");
    }
    c.rope_theta = static_cast<float>(base);
    c.rope_style = arch.rope_style;
    DS_RETURN_IF_ERROR(read_rope_scaling(g, a, c));
    c.qk_norm = arch.qk_norm;
    if (arch.gemma) DS_RETURN_IF_ERROR(read_gemma3(g, c));
    return Status();
}

}  // namespace deltaserve::model
