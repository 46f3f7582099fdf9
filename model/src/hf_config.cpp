// config.json of a Hugging Face model: the architecture, its sizes and its RoPE, every
// option that changes the graph either computed or refused.
#include "hf_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "deltaserve/common/mapped_file.h"

namespace deltaserve::model {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

struct ArchInfo {
    std::string_view hf_class;
    std::string_view model_type;
    std::string_view arch;
    bool qkv_bias;
    bool qk_norm;
    bool gemma;  // Gemma 3's graph (read_gemma3)
};

constexpr ArchInfo kArchs[] = {
    {"LlamaForCausalLM", "llama", "llama", false, false, false},
    {"MistralForCausalLM", "mistral", "mistral", false, false, false},
    {"Qwen2ForCausalLM", "qwen2", "qwen2", true, false, false},
    {"Qwen3ForCausalLM", "qwen3", "qwen3", false, true, false},
    {"Gemma3ForCausalLM", "gemma3_text", "gemma3", false, true, true},
};

// A JSON value that is absent or null counts as missing.
const json* field(const json& j, std::string_view key) {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
}

class ConfigReader {
  public:
    ConfigReader(const json& j, std::string path) : j_(j), path_(std::move(path)) {}

    // A positive int32; `fallback` when absent (std::nullopt: required).
    Result<int32_t> positive_int(std::string_view key, std::optional<int32_t> fallback) const {
        return positive_int(j_, key, fallback);
    }
    Result<int32_t> positive_int(const json& obj, std::string_view key,
                                 std::optional<int32_t> fallback) const {
        const json* v = field(obj, key);
        if (!v) {
            if (fallback) return *fallback;
            return invalid_argument(path_ + ": missing \"" + std::string(key) + "\"");
        }
        if (!v->is_number_integer() || v->get<int64_t>() <= 0 || v->get<int64_t>() > INT32_MAX) {
            return invalid_argument(path_ + ": \"" + std::string(key) +
                                    "\" must be a positive integer, got " + v->dump());
        }
        return static_cast<int32_t>(v->get<int64_t>());
    }

    // A finite number > 0 (below 1e30); `fallback` when absent.
    Result<float> positive_float(const json& obj, std::string_view key, float fallback) const {
        const json* v = field(obj, key);
        if (!v) return fallback;
        if (!v->is_number() || !(v->get<double>() > 0.0 && v->get<double>() < 1e30)) {
            return invalid_argument(path_ + ": \"" + std::string(key) +
                                    "\" must be a positive number, got " + v->dump());
        }
        return static_cast<float>(v->get<double>());
    }

    Result<bool> boolean(std::string_view key, bool fallback) const {
        const json* v = field(j_, key);
        if (!v) return fallback;
        if (!v->is_boolean()) {
            return invalid_argument(path_ + ": \"" + std::string(key) + "\" must be a boolean");
        }
        return v->get<bool>();
    }

    const json& root() const { return j_; }
    const std::string& path() const { return path_; }

  private:
    const json& j_;
    std::string path_;
};

Result<const ArchInfo*> find_arch(const ConfigReader& r) {
    std::string seen;
    if (const json* archs = field(r.root(), "architectures"); archs && archs->is_array()) {
        for (const json& a : *archs) {
            if (!a.is_string()) continue;
            for (const ArchInfo& info : kArchs) {
                if (a.get<std::string>() == info.hf_class) return &info;
            }
            if (!seen.empty()) seen += ", ";
            seen += a.get<std::string>();
        }
    } else if (const json* type = field(r.root(), "model_type"); type && type->is_string()) {
        for (const ArchInfo& info : kArchs) {
            if (type->get<std::string>() == info.model_type) return &info;
        }
        seen = "model_type " + type->get<std::string>();
    }
    if (seen.empty()) seen = "none given";
    return unimplemented(r.path() + ": unsupported architecture (" + seen +
                         "); supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, "
                         "Qwen3ForCausalLM, Gemma3ForCausalLM");
}

// Rejects the options that change the graph in ways deltaserve does not implement, rather
// than producing subtly wrong logits.
Status check_unsupported(const ConfigReader& r, const ArchInfo& arch) {
    const json& j = r.root();
    // Gemma's GeGLU takes the tanh GELU; the others SwiGLU.
    const char* act_key = arch.gemma ? "hidden_activation" : "hidden_act";
    const std::string want = arch.gemma ? "gelu_pytorch_tanh" : "silu";
    if (const json* act = field(j, act_key);
        act && !(act->is_string() && act->get<std::string>() == want)) {
        return unimplemented(r.path() + ": " + act_key + " " + act->dump() + " (only " + want +
                             ")");
    }
    if (const json* mlp_bias = field(j, "mlp_bias"); mlp_bias && *mlp_bias == true) {
        return unimplemented(r.path() + ": mlp_bias is not supported");
    }
    if (const json* p = field(j, "partial_rotary_factor"); p && !(p->is_number() && *p == 1.0)) {
        return unimplemented(r.path() + ": partial_rotary_factor " + p->dump() +
                             " (partial RoPE is not implemented)");
    }
    for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping"}) {
        if (field(j, key)) {
            return unimplemented(r.path() + ": " + key + " (logit softcapping is not implemented)");
        }
    }
    for (const char* key : {"num_experts", "num_local_experts", "n_routed_experts"}) {
        if (const json* n = field(j, key); n && !(n->is_number() && *n == 0)) {
            return unimplemented(r.path() + ": " + key + " " + n->dump() +
                                 " (mixtures of experts are not implemented)");
        }
    }
    return {};
}

// rope_scaling (transformers >= 5: rope_parameters, which also holds rope_theta): none,
// linear or llama3; anything else refused by name.
Status read_rope_scaling(const ConfigReader& r, const json& rope, ModelConfig& c) {
    const json* scaling = field(r.root(), "rope_scaling");
    if (scaling == nullptr && field(rope, "rope_type")) scaling = &rope;
    if (scaling == nullptr) return {};
    if (!scaling->is_object()) {
        return invalid_argument(r.path() + ": rope_scaling " + scaling->dump() +
                                " is not an object");
    }
    const json* type = field(*scaling, "rope_type");
    if (!type) type = field(*scaling, "type");
    if (!type || !type->is_string()) {
        return unimplemented(r.path() + ": rope_scaling " + scaling->dump() +
                             " names no rope_type");
    }
    const std::string t = type->get<std::string>();
    if (t == "default") return {};
    if (t != "linear" && t != "llama3") {
        return unimplemented(r.path() + ": rope_scaling of type '" + t +
                             "' is not implemented (default, linear and llama3 are)");
    }
    const std::string where = r.path() + ": rope_scaling";
    const json* f = field(*scaling, "factor");
    if (!f || !f->is_number() || !(f->get<double>() > 0.0 && f->get<double>() < 1e6)) {
        return invalid_argument(where + " needs a factor > 0, got " +
                                (f ? f->dump() : std::string("none")));
    }
    const float factor = static_cast<float>(f->get<double>());
    if (t == "linear") {
        c.rope_scaling = "linear";
        c.rope_freq_scale = 1.0f / factor;
        return {};
    }
    // llama3: the converter's defaults for what a config leaves out.
    DS_ASSIGN_OR_RETURN(const float low, r.positive_float(*scaling, "low_freq_factor", 1.0f));
    DS_ASSIGN_OR_RETURN(const float high, r.positive_float(*scaling, "high_freq_factor", 4.0f));
    DS_ASSIGN_OR_RETURN(const int32_t orig_top,
                        r.positive_int("original_max_position_embeddings", 8192));
    DS_ASSIGN_OR_RETURN(const int32_t orig,
                        r.positive_int(*scaling, "original_max_position_embeddings", orig_top));
    if (!(high > low)) {
        return invalid_argument(where + ": high_freq_factor must exceed low_freq_factor");
    }
    c.rope_scaling = "llama3";
    c.rope_freq_factors =
        llama3_rope_factors(c.rope_theta, c.head_dim, factor, low, high, static_cast<float>(orig));
    for (float x : c.rope_freq_factors) {
        if (!(std::isfinite(x) && x > 0.0f)) {
            return invalid_argument(where + " gives a factor of " + std::to_string(x));
        }
    }
    return {};
}

Status read_sizes(const ConfigReader& r, ModelConfig& c) {
    const json& j = r.root();
    DS_ASSIGN_OR_RETURN(c.d_model, r.positive_int("hidden_size", std::nullopt));
    DS_ASSIGN_OR_RETURN(c.n_layers, r.positive_int("num_hidden_layers", std::nullopt));
    DS_ASSIGN_OR_RETURN(c.n_heads, r.positive_int("num_attention_heads", std::nullopt));
    DS_ASSIGN_OR_RETURN(c.n_kv_heads, r.positive_int("num_key_value_heads", c.n_heads));
    if (!field(j, "head_dim") && c.d_model % c.n_heads != 0) {
        return invalid_argument(r.path() + ": hidden_size " + std::to_string(c.d_model) +
                                " is not a multiple of num_attention_heads " +
                                std::to_string(c.n_heads) + " and head_dim is not given");
    }
    DS_ASSIGN_OR_RETURN(c.head_dim, r.positive_int("head_dim", c.d_model / c.n_heads));
    DS_ASSIGN_OR_RETURN(c.d_ff, r.positive_int("intermediate_size", std::nullopt));
    DS_ASSIGN_OR_RETURN(c.n_vocab, r.positive_int("vocab_size", std::nullopt));
    if (c.n_heads % c.n_kv_heads != 0) {
        return invalid_argument(r.path() + ": num_attention_heads " + std::to_string(c.n_heads) +
                                " is not a multiple of num_key_value_heads " +
                                std::to_string(c.n_kv_heads));
    }
    if (c.head_dim % 2 != 0 || c.head_dim > 1024) {
        return invalid_argument(r.path() + ": head_dim " + std::to_string(c.head_dim) +
                                " (even, at most 1024: RoPE rotates pairs)");
    }
    if (int64_t{c.n_heads} * c.head_dim > (1 << 30)) {
        return invalid_argument(r.path() + ": " + std::to_string(c.n_heads) + " heads of " +
                                std::to_string(c.head_dim) + " are too wide");
    }
    return {};
}

// Gemma 3 as transformers' Gemma3TextModel computes it: the embedding times sqrt(hidden_size),
// GeGLU, post norms, queries scaled by query_pre_attn_scalar^-0.5, sliding-window layers
// (layer_types, else every sliding_window_pattern-th layer global) at rope_local_base_freq,
// unscaled. Its RMSNorms multiply by 1 + weight: the loader adds the 1.
Status read_gemma3(const ConfigReader& r, ModelConfig& c) {
    const json& j = r.root();
    c.embedding_scale = std::sqrt(static_cast<float>(c.d_model));
    c.gelu_ffn = true;
    c.post_norms = true;
    DS_ASSIGN_OR_RETURN(const float scalar, r.positive_float(j, "query_pre_attn_scalar",
                                                             static_cast<float>(c.head_dim)));
    c.attention_scale = 1.0f / std::sqrt(scalar);
    DS_ASSIGN_OR_RETURN(c.rope_theta_local, r.positive_float(j, "rope_local_base_freq", 10000.0f));
    DS_ASSIGN_OR_RETURN(const int32_t window, r.positive_int("sliding_window", 0));
    if (window == 0) return {};
    c.sliding_window = window;
    c.local_layer.clear();
    if (const json* types = field(j, "layer_types")) {
        if (!types->is_array() || types->size() != static_cast<size_t>(c.n_layers)) {
            return invalid_argument(r.path() + ": layer_types must list num_hidden_layers types");
        }
        for (const json& t : *types) {
            if (t == "sliding_attention") {
                c.local_layer.push_back(true);
            } else if (t == "full_attention") {
                c.local_layer.push_back(false);
            } else {
                return unimplemented(r.path() + ": layer type " + t.dump());
            }
        }
    } else {
        DS_ASSIGN_OR_RETURN(c.local_pattern, r.positive_int("sliding_window_pattern", 6));
    }
    return {};
}

}  // namespace

std::vector<float> llama3_rope_factors(float base, int head_dim, float factor,
                                       float low_freq_factor, float high_freq_factor,
                                       float original_context) {
    // convert_hf_to_gguf.py in torch float32: freqs = 1 / base ** (arange(0, d, 2) / d);
    // wavelen = 2 pi / freq; the python scalars meet the float32 values as float32.
    const float two_pi = static_cast<float>(2.0 * M_PI);
    const float low_wavelen = static_cast<float>(double{original_context} / low_freq_factor);
    const float high_wavelen = static_cast<float>(double{original_context} / high_freq_factor);
    const float span = static_cast<float>(double{high_freq_factor} - double{low_freq_factor});
    std::vector<float> out;
    for (int i = 0; i < head_dim; i += 2) {
        const float freq =
            1.0f / std::pow(base, static_cast<float>(i) / static_cast<float>(head_dim));
        const float wavelen = two_pi / freq;
        if (wavelen < high_wavelen) {
            out.push_back(1.0f);
        } else if (wavelen > low_wavelen) {
            out.push_back(factor);
        } else {
            const float smooth = (original_context / wavelen - low_freq_factor) / span;
            out.push_back(1.0f / ((1.0f - smooth) / factor + smooth));
        }
    }
    return out;
}

Result<ModelConfig> parse_hf_config(const std::string& dir) {
    const std::string path = (fs::path(dir) / "config.json").string();
    if (!fs::exists(path)) return not_found(dir + ": no config.json (not a Hugging Face model)");
    DS_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
    const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return invalid_argument(path + ": not valid JSON");
    if (!j.is_object()) return invalid_argument(path + ": not a JSON object");
    ConfigReader r(j, path);
    // transformers >= 5 moves rope_theta into rope_parameters.
    const json* rope_params = field(j, "rope_parameters");
    const json& rope = rope_params && rope_params->is_object() ? *rope_params : j;

    DS_ASSIGN_OR_RETURN(const ArchInfo* arch, find_arch(r));
    DS_RETURN_IF_ERROR(check_unsupported(r, *arch));
    ModelConfig c;
    c.arch = std::string(arch->arch);
    c.name = fs::path(dir).lexically_normal().filename().string();
    if (c.name.empty()) {
        c.name = fs::path(dir).lexically_normal().parent_path().filename().string();
    }
    DS_RETURN_IF_ERROR(read_sizes(r, c));
    DS_ASSIGN_OR_RETURN(c.n_ctx_train, r.positive_int("max_position_embeddings", 2048));
    // Sliding-window attention (Mistral v0.1, Qwen2 with use_sliding_window) equals full
    // attention up to the window, so the usable context is capped there.
    DS_ASSIGN_OR_RETURN(const int32_t window, r.positive_int("sliding_window", INT32_MAX));
    DS_ASSIGN_OR_RETURN(const bool use_window, r.boolean("use_sliding_window", true));
    if (use_window) c.n_ctx_train = std::min(c.n_ctx_train, window);
    DS_ASSIGN_OR_RETURN(c.rms_eps, r.positive_float(j, "rms_norm_eps", 1e-6f));
    DS_ASSIGN_OR_RETURN(c.rope_theta, r.positive_float(rope, "rope_theta", 10000.0f));
    DS_RETURN_IF_ERROR(read_rope_scaling(r, rope, c));
    // transformers' default: tied for Gemma 3, not for the others.
    DS_ASSIGN_OR_RETURN(c.tied_output, r.boolean("tie_word_embeddings", arch->gemma));
    DS_ASSIGN_OR_RETURN(const bool attention_bias, r.boolean("attention_bias", false));
    c.qkv_bias = arch->qkv_bias || attention_bias;
    c.qk_norm = arch->qk_norm;
    c.rope_style = kernels::RopeStyle::kSplitHalf;
    if (arch->gemma) DS_RETURN_IF_ERROR(read_gemma3(r, c));
    return c;
}

}  // namespace deltaserve::model
