// GGUF models: hyperparameters and tokenizer from the metadata, weights used in place.
#include <sys/mman.h>

#include <string>

#include "deltaserve/common/logging.h"
#include "deltaserve/kernels/quant.h"
#include "deltaserve/model/model.h"
#include "gguf_file.h"
#include "loader_common.h"

namespace deltaserve::model {

namespace {

// Texts that end a turn in the chat formats deltaserve knows, besides the EOS id.
constexpr const char* kEogTexts[] = {"<|im_end|>", "<|endoftext|>", "<|eot_id|>",
                                     "<|end_of_text|>", "<|eom_id|>", "<end_of_turn>"};

Result<kernels::WeightMatrix> matrix(const GgufFile& g, const std::string& name, int64_t rows,
                                     int64_t cols) {
    const GgufTensorInfo* t = g.find_tensor(name);
    if (t == nullptr) return not_found(g.path() + ": tensor '" + name + "' is missing");
    if (t->ne.size() != 2 || t->ne[0] != cols || t->ne[1] != rows) {
        return invalid_argument(g.path() + ": tensor '" + name + "' has shape [" +
                                std::to_string(t->ne[0]) + (t->ne.size() > 1 ? ", " + std::to_string(t->ne[1]) : "") +
                                "], expected [" + std::to_string(cols) + ", " + std::to_string(rows) + "]");
    }
    return kernels::WeightMatrix{t->type, rows, cols, t->data};
}

Result<std::vector<float>> vector(const GgufFile& g, const std::string& name, int64_t n,
                                  bool optional = false) {
    const GgufTensorInfo* t = g.find_tensor(name);
    if (t == nullptr) {
        if (optional) return std::vector<float>();
        return not_found(g.path() + ": tensor '" + name + "' is missing");
    }
    if (t->ne.size() != 1 || t->ne[0] != n) {
        return invalid_argument(g.path() + ": tensor '" + name + "' should have " +
                                std::to_string(n) + " elements");
    }
    std::vector<float> v(static_cast<size_t>(n));
    kernels::dequantize_row(t->type, t->data, v.data(), n);
    return v;
}

Result<int32_t> hparam(const GgufFile& g, const std::string& arch, const char* key) {
    DS_ASSIGN_OR_RETURN(int64_t v, g.get_int(arch + "." + key));
    if (v <= 0 || v > (1ll << 30)) {
        return invalid_argument(g.path() + ": " + arch + "." + key + " = " + std::to_string(v) +
                                " is out of range");
    }
    return static_cast<int32_t>(v);
}

Status read_config(const GgufFile& g, ModelConfig& c) {
    DS_ASSIGN_OR_RETURN(c.arch, g.get_string("general.architecture"));
    if (c.arch != "llama" && c.arch != "qwen2" && c.arch != "mistral") {
        return unimplemented(g.path() + ": architecture '" + c.arch +
                             "' is not supported (llama, qwen2, mistral are)");
    }
    const std::string& a = c.arch;
    auto name = g.get_string("general.name");
    c.name = name ? *name : g.path().substr(g.path().find_last_of('/') + 1);
    DS_ASSIGN_OR_RETURN(c.d_model, hparam(g, a, "embedding_length"));
    DS_ASSIGN_OR_RETURN(c.n_layers, hparam(g, a, "block_count"));
    DS_ASSIGN_OR_RETURN(c.n_heads, hparam(g, a, "attention.head_count"));
    DS_ASSIGN_OR_RETURN(c.d_ff, hparam(g, a, "feed_forward_length"));
    c.n_kv_heads = c.n_heads;
    if (g.has(a + ".attention.head_count_kv")) {
        DS_ASSIGN_OR_RETURN(c.n_kv_heads, hparam(g, a, "attention.head_count_kv"));
    }
    if (auto ctx = hparam(g, a, "context_length")) c.n_ctx_train = *ctx;
    if (auto eps = g.get_float(a + ".attention.layer_norm_rms_epsilon")) c.rms_eps = static_cast<float>(*eps);
    if (auto base = g.get_float(a + ".rope.freq_base")) c.rope_theta = static_cast<float>(*base);
    if (c.d_model % c.n_heads != 0 || c.n_heads % c.n_kv_heads != 0) {
        return invalid_argument(g.path() + ": head counts do not divide the model width");
    }
    c.head_dim = c.d_model / c.n_heads;
    if (auto rot = g.get_int(a + ".rope.dimension_count"); rot && *rot != c.head_dim) {
        return unimplemented(g.path() + ": partial RoPE (rope.dimension_count != head size)");
    }
    // llama.cpp: "llama" weights are permuted for the interleaved RoPE; qwen2 keeps the
    // Hugging Face layout and uses NeoX (split-half) RoPE.
    c.rope_style = c.arch == "qwen2" ? kernels::RopeStyle::kSplitHalf : kernels::RopeStyle::kInterleaved;
    c.qkv_bias = c.arch == "qwen2";
    const GgufTensorInfo* emb = g.find_tensor("token_embd.weight");
    if (emb == nullptr || emb->ne.size() != 2) return not_found(g.path() + ": token_embd.weight is missing");
    c.n_vocab = static_cast<int32_t>(emb->ne[1]);
    c.tied_output = g.find_tensor("output.weight") == nullptr;
    return Status();
}

Status read_weights(const GgufFile& g, const ModelConfig& c, ModelWeights& w) {
    DS_ASSIGN_OR_RETURN(w.token_embd, matrix(g, "token_embd.weight", c.n_vocab, c.d_model));
    DS_ASSIGN_OR_RETURN(w.output_norm, vector(g, "output_norm.weight", c.d_model));
    if (c.tied_output) {
        w.output = w.token_embd;
    } else {
        DS_ASSIGN_OR_RETURN(w.output, matrix(g, "output.weight", c.n_vocab, c.d_model));
    }
    // Layer by layer, not resized up front: block_count may be anything up to 2^30, and
    // only the file's tensors say how many layers there are.
    w.layers.clear();
    for (int32_t i = 0; i < c.n_layers; ++i) {
        const std::string p = "blk." + std::to_string(i) + ".";
        LayerWeights& l = w.layers.emplace_back();
        DS_ASSIGN_OR_RETURN(l.attn_norm, vector(g, p + "attn_norm.weight", c.d_model));
        DS_ASSIGN_OR_RETURN(l.wq, matrix(g, p + "attn_q.weight", c.q_dim(), c.d_model));
        DS_ASSIGN_OR_RETURN(l.wk, matrix(g, p + "attn_k.weight", c.kv_dim(), c.d_model));
        DS_ASSIGN_OR_RETURN(l.wv, matrix(g, p + "attn_v.weight", c.kv_dim(), c.d_model));
        DS_ASSIGN_OR_RETURN(l.wo, matrix(g, p + "attn_output.weight", c.d_model, c.q_dim()));
        DS_ASSIGN_OR_RETURN(l.bq, vector(g, p + "attn_q.bias", c.q_dim(), true));
        DS_ASSIGN_OR_RETURN(l.bk, vector(g, p + "attn_k.bias", c.kv_dim(), true));
        DS_ASSIGN_OR_RETURN(l.bv, vector(g, p + "attn_v.bias", c.kv_dim(), true));
        if (l.bq.empty() != l.bk.empty() || l.bq.empty() != l.bv.empty()) {
            return invalid_argument(g.path() + ": layer " + std::to_string(i) +
                                    " has some but not all of the q/k/v biases");
        }
        DS_ASSIGN_OR_RETURN(l.ffn_norm, vector(g, p + "ffn_norm.weight", c.d_model));
        DS_ASSIGN_OR_RETURN(l.w_gate, matrix(g, p + "ffn_gate.weight", c.d_ff, c.d_model));
        DS_ASSIGN_OR_RETURN(l.w_up, matrix(g, p + "ffn_up.weight", c.d_ff, c.d_model));
        DS_ASSIGN_OR_RETURN(l.w_down, matrix(g, p + "ffn_down.weight", c.d_model, c.d_ff));
    }
    return Status();
}

// Reads every page of the tensor data once, so the first request does not pay the page
// faults, drawing progress as it goes.
void prefault(const GgufFile& g, bool show_progress) {
    ProgressBar bar("loading " + g.path().substr(g.path().find_last_of('/') + 1));
    size_t total = 0, done = 0;
    for (const auto& t : g.tensors()) total += t.bytes;
    volatile uint8_t sink = 0;
    for (const auto& t : g.tensors()) {
        madvise(const_cast<uint8_t*>(reinterpret_cast<const uint8_t*>(
                    reinterpret_cast<uintptr_t>(t.data) & ~uintptr_t{4095})),
                t.bytes, MADV_WILLNEED);
        for (size_t off = 0; off < t.bytes; off += 4096) sink = sink + t.data[off];
        done += t.bytes;
        if (show_progress) bar.update(static_cast<double>(done) / static_cast<double>(total));
    }
    (void)sink;
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> gguf_tokenizer(const GgufFile& g) {
    Vocab v;
    DS_ASSIGN_OR_RETURN(std::string kind, g.get_string("tokenizer.ggml.model"));
    DS_ASSIGN_OR_RETURN(v.tokens, g.get_string_array("tokenizer.ggml.tokens"));
    if (g.has("tokenizer.ggml.token_type")) {
        DS_ASSIGN_OR_RETURN(auto types, g.get_int_array("tokenizer.ggml.token_type"));
        if (types.size() != v.tokens.size()) return data_loss(g.path() + ": token_type length mismatch");
        for (int32_t t : types) v.types.push_back(static_cast<TokenType>(t));
    }
    if (g.has("tokenizer.ggml.scores")) {
        DS_ASSIGN_OR_RETURN(v.scores, g.get_float_array("tokenizer.ggml.scores"));
        if (v.scores.size() != v.tokens.size()) return data_loss(g.path() + ": scores length mismatch");
    }
    auto id = [&](const char* key) -> int32_t {
        auto r = g.get_int(key);
        return r && *r >= 0 && *r < static_cast<int64_t>(v.tokens.size()) ? static_cast<int32_t>(*r) : -1;
    };
    v.bos_id = id("tokenizer.ggml.bos_token_id");
    v.eos_id = id("tokenizer.ggml.eos_token_id");
    v.unk_id = id("tokenizer.ggml.unknown_token_id");
    v.pad_id = id("tokenizer.ggml.padding_token_id");
    for (int32_t i = 0; i < static_cast<int32_t>(v.tokens.size()); ++i) {
        for (const char* text : kEogTexts) {
            if (v.tokens[i] == text) v.eog_ids.push_back(i);
        }
    }
    if (kind == "gpt2") {
        DS_ASSIGN_OR_RETURN(v.merges, g.get_string_array("tokenizer.ggml.merges"));
        if (auto pre = g.get_string("tokenizer.ggml.pre")) v.pre = *pre;
        v.add_bos = false;
        if (auto b = g.get_bool("tokenizer.ggml.add_bos_token")) v.add_bos = *b;
        return make_bpe_tokenizer(std::move(v));
    }
    if (kind == "llama") {
        v.add_bos = true;
        if (auto b = g.get_bool("tokenizer.ggml.add_bos_token")) v.add_bos = *b;
        if (auto b = g.get_bool("tokenizer.ggml.add_space_prefix")) v.add_space_prefix = *b;
        return make_spm_tokenizer(std::move(v));
    }
    return unimplemented(g.path() + ": tokenizer model '" + kind + "' is not supported (gpt2, llama are)");
}

Result<std::unique_ptr<Tokenizer>> load_gguf_tokenizer(const std::string& path) {
    DS_ASSIGN_OR_RETURN(GgufFile g, GgufFile::open(path));
    return gguf_tokenizer(g);
}

Result<std::unique_ptr<Model>> load_gguf_model(const std::string& path, const LoadOptions& options) {
    DS_ASSIGN_OR_RETURN(GgufFile g, GgufFile::open(path));
    auto model = std::make_unique<Model>();
    DS_RETURN_IF_ERROR(read_config(g, model->config));
    DS_RETURN_IF_ERROR(read_weights(g, model->config, model->weights));
    if (!options.tokenizer_path.empty()) {
        DS_ASSIGN_OR_RETURN(model->tokenizer,
                            load_tokenizer_file(options.tokenizer_path, model->config.n_vocab));
    } else {
        DS_ASSIGN_OR_RETURN(model->tokenizer, gguf_tokenizer(g));
    }
    if (model->tokenizer->vocab_size() != model->config.n_vocab) {
        return invalid_argument(path + ": the tokenizer has " +
                                std::to_string(model->tokenizer->vocab_size()) +
                                " tokens but the model " + std::to_string(model->config.n_vocab));
    }
    if (auto tmpl = g.get_string("tokenizer.chat_template")) {
        if (auto t = detect_chat_template(*tmpl)) {
            model->chat_template = *t;
        } else {
            spdlog::warn("{}: {}; using ChatML", path, t.error().message());
        }
    }
    prefault(g, options.show_progress);
    model->format = "gguf";
    model->weights.files.push_back(g.release_mapping());
    return model;
}

}  // namespace deltaserve::model
