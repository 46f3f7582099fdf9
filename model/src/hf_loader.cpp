// The Hugging Face loader: config.json + safetensors (single or sharded) + tokenizer.json.
//
// Weights stay in the mappings (F32/F16/BF16 WeightMatrix, HF [out, in] row-major is
// rows = out, cols = in); norms and biases are converted to float. HF checkpoints keep
// q_proj/k_proj in the split-half RoPE layout (rotate_half), so the config says kSplitHalf
// and no row permutation is done (notes/cpu-inference.md, "RoPE layout").
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "deltaserve/common/fp16.h"
#include "deltaserve/common/logging.h"
#include "deltaserve/model/model.h"
#include "loader_common.h"
#include "safetensors.h"

namespace deltaserve::model {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// --- config.json -------------------------------------------------------------------------

struct ArchInfo {
    std::string_view hf_class;
    std::string_view model_type;
    std::string_view arch;
    bool qkv_bias;
};

constexpr ArchInfo kArchs[] = {
    {"LlamaForCausalLM", "llama", "llama", false},
    {"MistralForCausalLM", "mistral", "mistral", false},
    {"Qwen2ForCausalLM", "qwen2", "qwen2", true},
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
        const json* v = field(j_, key);
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

    Result<float> positive_float(const json& obj, std::string_view key, float fallback) const {
        const json* v = field(obj, key);
        if (!v) return fallback;
        if (!v->is_number() || !(v->get<double>() > 0.0)) {
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
                         "); supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM");
}

// Rejects the options that change the graph in ways deltaserve does not implement, rather
// than producing subtly wrong logits.
Status check_unsupported(const ConfigReader& r, const json& rope) {
    if (const json* act = field(r.root(), "hidden_act");
        act && !(act->is_string() && act->get<std::string>() == "silu")) {
        return unimplemented(r.path() + ": hidden_act " + act->dump() + " (only silu)");
    }
    if (const json* scaling = field(r.root(), "rope_scaling"); scaling && scaling->is_object()) {
        const json* type = field(*scaling, "rope_type");
        if (!type) type = field(*scaling, "type");
        if (!type || !type->is_string() || type->get<std::string>() != "default") {
            return unimplemented(r.path() + ": rope_scaling " + scaling->dump() +
                                 " is not supported");
        }
    }
    if (const json* type = field(rope, "rope_type");
        type && !(type->is_string() && type->get<std::string>() == "default")) {
        return unimplemented(r.path() + ": rope_type " + type->dump() + " is not supported");
    }
    if (const json* mlp_bias = field(r.root(), "mlp_bias"); mlp_bias && *mlp_bias == true) {
        return unimplemented(r.path() + ": mlp_bias is not supported");
    }
    return {};
}

Result<ModelConfig> parse_config(const std::string& dir) {
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
    DS_RETURN_IF_ERROR(check_unsupported(r, rope));
    ModelConfig c;
    c.arch = std::string(arch->arch);
    c.name = fs::path(dir).lexically_normal().filename().string();
    if (c.name.empty()) {
        c.name = fs::path(dir).lexically_normal().parent_path().filename().string();
    }
    DS_ASSIGN_OR_RETURN(c.d_model, r.positive_int("hidden_size", std::nullopt));
    DS_ASSIGN_OR_RETURN(c.n_layers, r.positive_int("num_hidden_layers", std::nullopt));
    DS_ASSIGN_OR_RETURN(c.n_heads, r.positive_int("num_attention_heads", std::nullopt));
    DS_ASSIGN_OR_RETURN(c.n_kv_heads, r.positive_int("num_key_value_heads", c.n_heads));
    if (!field(j, "head_dim") && c.d_model % c.n_heads != 0) {
        return invalid_argument(path + ": hidden_size " + std::to_string(c.d_model) +
                                " is not a multiple of num_attention_heads " +
                                std::to_string(c.n_heads) + " and head_dim is not given");
    }
    DS_ASSIGN_OR_RETURN(c.head_dim, r.positive_int("head_dim", c.d_model / c.n_heads));
    DS_ASSIGN_OR_RETURN(c.d_ff, r.positive_int("intermediate_size", std::nullopt));
    DS_ASSIGN_OR_RETURN(c.n_vocab, r.positive_int("vocab_size", std::nullopt));
    DS_ASSIGN_OR_RETURN(c.n_ctx_train, r.positive_int("max_position_embeddings", 2048));
    // Sliding-window attention (Mistral v0.1, Qwen2 with use_sliding_window) equals full
    // attention up to the window, so the usable context is capped there.
    DS_ASSIGN_OR_RETURN(const int32_t window, r.positive_int("sliding_window", INT32_MAX));
    DS_ASSIGN_OR_RETURN(const bool use_window, r.boolean("use_sliding_window", true));
    if (use_window) c.n_ctx_train = std::min(c.n_ctx_train, window);
    DS_ASSIGN_OR_RETURN(c.rms_eps, r.positive_float(j, "rms_norm_eps", 1e-6f));
    DS_ASSIGN_OR_RETURN(c.rope_theta, r.positive_float(rope, "rope_theta", 10000.0f));
    DS_ASSIGN_OR_RETURN(c.tied_output, r.boolean("tie_word_embeddings", false));
    DS_ASSIGN_OR_RETURN(const bool attention_bias, r.boolean("attention_bias", false));
    c.qkv_bias = arch->qkv_bias || attention_bias;
    if (c.n_heads % c.n_kv_heads != 0) {
        return invalid_argument(path + ": num_attention_heads " + std::to_string(c.n_heads) +
                                " is not a multiple of num_key_value_heads " +
                                std::to_string(c.n_kv_heads));
    }
    if (c.head_dim % 2 != 0) {
        return invalid_argument(path + ": head_dim " + std::to_string(c.head_dim) +
                                " is odd (RoPE rotates pairs)");
    }
    c.rope_style = kernels::RopeStyle::kSplitHalf;
    return c;
}

// --- tensors -----------------------------------------------------------------------------

class TensorReader {
  public:
    TensorReader(const SafetensorsModel& st, ModelWeights& weights) : st_(st), w_(weights) {}

    // A 2-D weight of shape [rows, cols] used in place (copied only when its address is
    // not aligned to its element size).
    Result<WeightMatrix> matrix(const std::string& name, int64_t rows, int64_t cols) {
        DS_ASSIGN_OR_RETURN(const SafetensorsTensor* t, get(name, {rows, cols}));
        DS_ASSIGN_OR_RETURN(kernels::DType type, typed(name, *t));
        WeightMatrix m{type, rows, cols, t->data};
        const size_t elem = type == kernels::DType::kF32 ? 4 : 2;
        if (reinterpret_cast<uintptr_t>(t->data) % elem != 0) {
            uint8_t* copy = w_.allocate(t->n_bytes);
            std::memcpy(copy, t->data, t->n_bytes);
            m.data = copy;
        }
        return m;
    }

    // A 1-D tensor of n elements, converted to float.
    Result<std::vector<float>> vector(const std::string& name, int64_t n) {
        DS_ASSIGN_OR_RETURN(const SafetensorsTensor* t, get(name, {n}));
        DS_ASSIGN_OR_RETURN(kernels::DType type, typed(name, *t));
        std::vector<float> out(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) {
            if (type == kernels::DType::kF32) {
                std::memcpy(&out[i], t->data + 4 * i, 4);
            } else {
                uint16_t h;
                std::memcpy(&h, t->data + 2 * i, 2);
                out[i] = type == kernels::DType::kF16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
            }
        }
        return out;
    }

    bool contains(const std::string& name) const { return st_.contains(name); }

  private:
    Result<const SafetensorsTensor*> get(const std::string& name,
                                         const std::vector<int64_t>& shape) {
        DS_ASSIGN_OR_RETURN(const SafetensorsTensor* t, st_.get(name));
        if (t->shape != shape) {
            return invalid_argument(st_.file_of(name) + ": tensor '" + name + "' has shape " +
                                    shape_string(t->shape) + ", expected " + shape_string(shape) +
                                    " from config.json");
        }
        return t;
    }

    Result<kernels::DType> typed(const std::string& name, const SafetensorsTensor& t) {
        auto type = t.compute_type(name);
        if (!type) return type.error().with_context(st_.file_of(name));
        return type;
    }

    static std::string shape_string(const std::vector<int64_t>& shape) {
        std::string s = "[";
        for (size_t i = 0; i < shape.size(); ++i) {
            if (i) s += ", ";
            s += std::to_string(shape[i]);
        }
        return s + "]";
    }

    const SafetensorsModel& st_;
    ModelWeights& w_;
};

Status load_layer(TensorReader& r, const ModelConfig& c, int layer, LayerWeights& l) {
    const std::string p = "model.layers." + std::to_string(layer) + ".";
    const int64_t d = c.d_model, q = c.q_dim(), kv = c.kv_dim(), ff = c.d_ff;
    DS_ASSIGN_OR_RETURN(l.attn_norm, r.vector(p + "input_layernorm.weight", d));
    DS_ASSIGN_OR_RETURN(l.wq, r.matrix(p + "self_attn.q_proj.weight", q, d));
    DS_ASSIGN_OR_RETURN(l.wk, r.matrix(p + "self_attn.k_proj.weight", kv, d));
    DS_ASSIGN_OR_RETURN(l.wv, r.matrix(p + "self_attn.v_proj.weight", kv, d));
    DS_ASSIGN_OR_RETURN(l.wo, r.matrix(p + "self_attn.o_proj.weight", d, q));
    if (c.qkv_bias) {
        DS_ASSIGN_OR_RETURN(l.bq, r.vector(p + "self_attn.q_proj.bias", q));
        DS_ASSIGN_OR_RETURN(l.bk, r.vector(p + "self_attn.k_proj.bias", kv));
        DS_ASSIGN_OR_RETURN(l.bv, r.vector(p + "self_attn.v_proj.bias", kv));
    }
    for (const char* bias : {"self_attn.o_proj.bias", "mlp.gate_proj.bias", "mlp.up_proj.bias",
                             "mlp.down_proj.bias"}) {
        if (r.contains(p + bias)) {
            return unimplemented("tensor '" + p + bias + "': this bias is not supported");
        }
    }
    DS_ASSIGN_OR_RETURN(l.ffn_norm, r.vector(p + "post_attention_layernorm.weight", d));
    DS_ASSIGN_OR_RETURN(l.w_gate, r.matrix(p + "mlp.gate_proj.weight", ff, d));
    DS_ASSIGN_OR_RETURN(l.w_up, r.matrix(p + "mlp.up_proj.weight", ff, d));
    DS_ASSIGN_OR_RETURN(l.w_down, r.matrix(p + "mlp.down_proj.weight", d, ff));
    return {};
}

Status load_weights(SafetensorsModel& st, ModelConfig& c, ModelWeights& w, bool progress) {
    TensorReader r(st, w);
    // Biases present without the config saying so (e.g. attention_bias missing) are used.
    if (!c.qkv_bias && r.contains("model.layers.0.self_attn.q_proj.bias")) c.qkv_bias = true;
    DS_ASSIGN_OR_RETURN(w.token_embd, r.matrix("model.embed_tokens.weight", c.n_vocab, c.d_model));
    std::optional<ProgressBar> bar;
    if (progress) bar.emplace("loading");
    // Layer by layer, not resized up front: num_hidden_layers may be anything up to 2^31,
    // and only the checkpoint's tensors say how many layers there are.
    w.layers.clear();
    for (int i = 0; i < c.n_layers; ++i) {
        DS_RETURN_IF_ERROR(load_layer(r, c, i, w.layers.emplace_back()));
        if (bar) bar->update(static_cast<double>(i + 1) / c.n_layers);
    }
    DS_ASSIGN_OR_RETURN(w.output_norm, r.vector("model.norm.weight", c.d_model));
    if (c.tied_output) {
        w.output = w.token_embd;
    } else if (!r.contains("lm_head.weight")) {
        return not_found(
            "tensor 'lm_head.weight' not found and config.json does not set "
            "tie_word_embeddings");
    } else {
        DS_ASSIGN_OR_RETURN(w.output, r.matrix("lm_head.weight", c.n_vocab, c.d_model));
    }
    st.release_mappings(w.files);
    return {};
}

// --- tokenizer and chat template ---------------------------------------------------------

Result<ChatTemplate> load_chat_template(const std::string& dir) {
    std::string jinja;
    const fs::path config_path = fs::path(dir) / "tokenizer_config.json";
    if (fs::exists(config_path)) {
        DS_ASSIGN_OR_RETURN(std::string text, read_text_file(config_path.string()));
        const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
        if (j.is_discarded() || !j.is_object()) {
            return invalid_argument(config_path.string() + ": not a valid JSON object");
        }
        const json* tmpl = field(j, "chat_template");
        if (tmpl && tmpl->is_string()) {
            jinja = tmpl->get<std::string>();
        } else if (tmpl && tmpl->is_array()) {  // [{"name": "default", "template": "..."}]
            for (const json& e : *tmpl) {
                const json* name = e.is_object() ? field(e, "name") : nullptr;
                const json* body = e.is_object() ? field(e, "template") : nullptr;
                if (name && body && *name == "default" && body->is_string()) {
                    jinja = body->get<std::string>();
                }
            }
        }
    }
    const fs::path jinja_path = fs::path(dir) / "chat_template.jinja";
    if (jinja.empty() && fs::exists(jinja_path)) {
        DS_ASSIGN_OR_RETURN(jinja, read_text_file(jinja_path.string()));
    }
    if (jinja.empty()) return ChatTemplate{};
    auto detected = detect_chat_template(jinja);
    if (!detected) {
        // Plain completion still works; only chat framing is affected.
        spdlog::warn("{}: {}; using ChatML", dir, detected.error().message());
        return ChatTemplate{};
    }
    return detected;
}

Result<std::unique_ptr<Tokenizer>> load_tokenizer(const std::string& dir,
                                                  const LoadOptions& options, int32_t n_vocab) {
    std::unique_ptr<Tokenizer> tok;
    if (!options.tokenizer_path.empty()) {
        DS_ASSIGN_OR_RETURN(tok, load_tokenizer_file(options.tokenizer_path, n_vocab));
    } else {
        const std::string path = (fs::path(dir) / "tokenizer.json").string();
        if (!fs::exists(path)) {
            return not_found(dir + ": no tokenizer.json (give one with --tokenizer)");
        }
        auto loaded = load_hf_tokenizer(path);
        if (!loaded) return loaded.error().with_context(path);
        tok = std::move(loaded).value();
    }
    if (tok->vocab_size() > n_vocab) {
        return invalid_argument("the tokenizer has " + std::to_string(tok->vocab_size()) +
                                " tokens but the model's vocab_size is " + std::to_string(n_vocab));
    }
    return tok;
}

}  // namespace

Result<std::unique_ptr<Model>> load_hf_model(const std::string& dir, const LoadOptions& options) {
    auto model = std::make_unique<Model>();
    model->format = "hf";
    DS_ASSIGN_OR_RETURN(model->config, parse_config(dir));
    DS_ASSIGN_OR_RETURN(SafetensorsModel st, SafetensorsModel::open_dir(dir));
    DS_RETURN_IF_ERROR(load_weights(st, model->config, model->weights, options.show_progress)
                           .with_context("loading " + dir));
    DS_ASSIGN_OR_RETURN(model->tokenizer, load_tokenizer(dir, options, model->config.n_vocab));
    DS_ASSIGN_OR_RETURN(model->chat_template, load_chat_template(dir));
    return model;
}

}  // namespace deltaserve::model
