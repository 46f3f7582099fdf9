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
#include <set>

#include "deltaserve/common/fp16.h"
#include "deltaserve/common/logging.h"
#include "deltaserve/model/model.h"
#include "hf_config.h"
#include "loader_common.h"
#include "safetensors.h"

namespace deltaserve::model {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// A JSON value that is absent or null counts as missing.
const json* field(const json& j, std::string_view key) {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
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

    // kUnimplemented naming the first of `names` (every tensor of the checkpoint) no part of
    // the model took. RoPE's inverse frequencies (rotary_emb.inv_freq, a buffer older
    // checkpoints saved) are made from config.json, as transformers makes them, and pass.
    Status all_taken(const std::vector<std::string>& names) const {
        for (const std::string& name : names) {
            if (taken_.count(name) != 0) continue;
            if (name.size() > 21 && name.ends_with(".rotary_emb.inv_freq")) continue;
            return unimplemented("tensor '" + name +
                                 "' is not used by the graph deltaserve computes (refused rather "
                                 "than ignored)");
        }
        return Status();
    }

  private:
    Result<const SafetensorsTensor*> get(const std::string& name,
                                         const std::vector<int64_t>& shape) {
        DS_ASSIGN_OR_RETURN(const SafetensorsTensor* t, st_.get(name));
        taken_.insert(name);
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
    std::set<std::string> taken_;
};

// Gemma's RMSNorm weights w are used as 1 + w (llama.cpp's converter adds the 1 too).
void plus_one(std::vector<float>& v) {
    for (float& x : v) x += 1.0f;
}

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
    if (c.qk_norm) {
        DS_ASSIGN_OR_RETURN(l.q_norm, r.vector(p + "self_attn.q_norm.weight", c.head_dim));
        DS_ASSIGN_OR_RETURN(l.k_norm, r.vector(p + "self_attn.k_norm.weight", c.head_dim));
    }
    if (c.post_norms) {
        // Gemma: post_attention_layernorm is the attention output's; the FFN's input norm is
        // pre_feedforward_layernorm. Its RMSNorms multiply by 1 + weight.
        DS_ASSIGN_OR_RETURN(l.attn_post_norm, r.vector(p + "post_attention_layernorm.weight", d));
        DS_ASSIGN_OR_RETURN(l.ffn_norm, r.vector(p + "pre_feedforward_layernorm.weight", d));
        DS_ASSIGN_OR_RETURN(l.ffn_post_norm, r.vector(p + "post_feedforward_layernorm.weight", d));
        for (auto* v : {&l.attn_norm, &l.q_norm, &l.k_norm, &l.attn_post_norm, &l.ffn_norm,
                        &l.ffn_post_norm}) {
            plus_one(*v);
        }
    } else {
        DS_ASSIGN_OR_RETURN(l.ffn_norm, r.vector(p + "post_attention_layernorm.weight", d));
    }
    DS_ASSIGN_OR_RETURN(l.w_gate, r.matrix(p + "mlp.gate_proj.weight", ff, d));
    DS_ASSIGN_OR_RETURN(l.w_up, r.matrix(p + "mlp.up_proj.weight", ff, d));
    DS_ASSIGN_OR_RETURN(l.w_down, r.matrix(p + "mlp.down_proj.weight", d, ff));
    return {};
}

// Every tensor of the directory's checkpoint: the index's names and every tensor of its shards
// (an index may leave some out), or model.safetensors'. open_dir has checked the files and
// the shard names already; their headers are read again here (safetensors.* keys the DeltaKV
// profile's cache: deploy/profile.sh).
Result<std::vector<std::string>> checkpoint_tensors(const std::string& dir) {
    std::set<std::string> names, files;
    const fs::path index = fs::path(dir) / "model.safetensors.index.json";
    if (fs::exists(index)) {
        DS_ASSIGN_OR_RETURN(std::string text, read_text_file(index.string()));
        const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
        const json* map = j.is_object() ? field(j, "weight_map") : nullptr;
        if (map == nullptr || !map->is_object()) {
            return invalid_argument(index.string() + ": no weight_map");
        }
        for (const auto& [name, file] : map->items()) {
            names.insert(name);
            if (file.is_string()) files.insert(file.get<std::string>());
        }
    } else {
        files.insert("model.safetensors");
    }
    for (const std::string& f : files) {
        DS_ASSIGN_OR_RETURN(SafetensorsFile sf,
                            SafetensorsFile::open((fs::path(dir) / f).string()));
        for (const auto& [name, t] : sf.tensors()) names.insert(name);
    }
    return std::vector<std::string>(names.begin(), names.end());
}

Status load_weights(SafetensorsModel& st, const std::vector<std::string>& all, ModelConfig& c,
                    ModelWeights& w, bool progress) {
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
    if (c.post_norms) plus_one(w.output_norm);
    if (c.tied_output) {
        w.output = w.token_embd;
        // A checkpoint may save the tied head too: the same bytes, or refused.
        if (r.contains("lm_head.weight")) {
            DS_ASSIGN_OR_RETURN(const WeightMatrix head,
                                r.matrix("lm_head.weight", c.n_vocab, c.d_model));
            if (head.type != w.token_embd.type ||
                std::memcmp(head.data, w.token_embd.data,
                            kernels::row_bytes(head.type, c.d_model) * c.n_vocab) != 0) {
                return unimplemented(
                    "tensor 'lm_head.weight' differs from model.embed_tokens.weight but "
                    "config.json ties them");
            }
        }
    } else if (!r.contains("lm_head.weight")) {
        return not_found(
            "tensor 'lm_head.weight' not found and config.json does not set "
            "tie_word_embeddings");
    } else {
        DS_ASSIGN_OR_RETURN(w.output, r.matrix("lm_head.weight", c.n_vocab, c.d_model));
    }
    DS_RETURN_IF_ERROR(r.all_taken(all));
    st.release_mappings(w.files);
    return {};
}

// --- tokenizer and chat template ---------------------------------------------------------

// The Jinja text of the model's chat template: tokenizer_config.json's chat_template (a
// string, or the "default" of a list), else chat_template.jinja; "" when neither.
Result<std::string> chat_template_source(const std::string& dir) {
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
    return jinja;
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
    DS_ASSIGN_OR_RETURN(model->config, parse_hf_config(dir));
    DS_ASSIGN_OR_RETURN(SafetensorsModel st, SafetensorsModel::open_dir(dir));
    DS_ASSIGN_OR_RETURN(const std::vector<std::string> all, checkpoint_tensors(dir));
    DS_RETURN_IF_ERROR(load_weights(st, all, model->config, model->weights, options.show_progress)
                           .with_context("loading " + dir));
    DS_ASSIGN_OR_RETURN(model->tokenizer, load_tokenizer(dir, options, model->config.n_vocab));
    DS_ASSIGN_OR_RETURN(const std::string jinja, chat_template_source(dir));
    if (!jinja.empty()) {
        const Tokenizer& tok = *model->tokenizer;
        model->chat_template = ChatTemplate::from_jinja(
            jinja, special_token_text(tok, tok.bos_id()), special_token_text(tok, tok.eos_id()));
        if (!model->chat_template.status().ok()) {
            // Completion still works; chat requests get this error.
            spdlog::warn("{}: the chat template cannot be used: {}", dir,
                         model->chat_template.status().message());
        }
    }
    return model;
}

}  // namespace deltaserve::model
