// GGUF models: hyperparameters and tokenizer from the metadata, weights used in place.
#include <sys/mman.h>

#include <cmath>
#include <set>
#include <string>

#include "deltaserve/common/logging.h"
#include "deltaserve/kernels/quant.h"
#include "deltaserve/model/model.h"
#include "gguf_config.h"
#include "gguf_file.h"
#include "loader_common.h"

namespace deltaserve::model {

namespace {

// Texts that end a turn in the chat formats deltaserve knows, besides the EOS id.
constexpr const char* kEogTexts[] = {"<|im_end|>",      "<|endoftext|>", "<|eot_id|>",
                                     "<|end_of_text|>", "<|eom_id|>",    "<end_of_turn>"};

// The file's tensors as the model takes them; every tensor must be taken by some part of
// the model (all_taken), so that none that changes the result is ignored.
class GgufTensors {
  public:
    explicit GgufTensors(const GgufFile& g) : g_(g) {}

    Result<kernels::WeightMatrix> matrix(const std::string& name, int64_t rows, int64_t cols) {
        const GgufTensorInfo* t = take(name);
        if (t == nullptr) return not_found(g_.path() + ": tensor '" + name + "' is missing");
        if (t->ne.size() != 2 || t->ne[0] != cols || t->ne[1] != rows) {
            return invalid_argument(g_.path() + ": tensor '" + name + "' has shape " + shape(*t) +
                                    ", expected [" + std::to_string(cols) + ", " +
                                    std::to_string(rows) + "]");
        }
        return kernels::WeightMatrix{t->type, rows, cols, t->data};
    }

    // A vector of n floats; empty when `optional` and the file has none.
    Result<std::vector<float>> vector(const std::string& name, int64_t n, bool optional = false) {
        const GgufTensorInfo* t = take(name);
        if (t == nullptr) {
            if (optional) return std::vector<float>();
            return not_found(g_.path() + ": tensor '" + name + "' is missing");
        }
        if (t->ne.size() != 1 || t->ne[0] != n) {
            return invalid_argument(g_.path() + ": tensor '" + name + "' has shape " + shape(*t) +
                                    ", expected [" + std::to_string(n) + "]");
        }
        std::vector<float> v(static_cast<size_t>(n));
        kernels::dequantize_row(t->type, t->data, v.data(), n);
        return v;
    }

    bool has(const std::string& name) const { return g_.find_tensor(name) != nullptr; }

    // kUnimplemented naming the first tensor no part of the model took.
    Status all_taken(const std::string& arch) const {
        for (const GgufTensorInfo& t : g_.tensors()) {
            if (taken_.count(t.name) == 0) {
                return unimplemented(g_.path() + ": tensor '" + t.name + "' is not used by the " +
                                     arch +
                                     " graph deltaserve computes (refused rather than "
                                     "ignored)");
            }
        }
        return Status();
    }

  private:
    const GgufTensorInfo* take(const std::string& name) {
        const GgufTensorInfo* t = g_.find_tensor(name);
        if (t != nullptr) taken_.insert(name);
        return t;
    }
    static std::string shape(const GgufTensorInfo& t) {
        std::string s = "[";
        for (size_t i = 0; i < t.ne.size(); ++i) s += (i ? ", " : "") + std::to_string(t.ne[i]);
        return s + "]";
    }

    const GgufFile& g_;
    std::set<std::string, std::less<>> taken_;
};

// n_vocab and the tied output from the tensors; vocab_size, when given, must agree.
Status read_vocab(const GgufFile& g, ModelConfig& c) {
    const GgufTensorInfo* emb = g.find_tensor("token_embd.weight");
    if (emb == nullptr || emb->ne.size() != 2 || emb->ne[1] <= 0 || emb->ne[1] > (1 << 30)) {
        return not_found(g.path() + ": token_embd.weight is missing or not a matrix");
    }
    c.n_vocab = static_cast<int32_t>(emb->ne[1]);
    if (auto n = g.get_int(c.arch + ".vocab_size"); n && *n != c.n_vocab) {
        return invalid_argument(g.path() + ": " + c.arch + ".vocab_size " + std::to_string(*n) +
                                " but token_embd.weight has " + std::to_string(c.n_vocab) +
                                " rows");
    }
    c.tied_output = g.find_tensor("output.weight") == nullptr;
    return Status();
}

// llama3 RoPE scaling: rope_freqs.weight, a divisor of each pair's angle.
Status read_rope_freqs(const GgufFile& g, const GgufArch& arch, GgufTensors& t, ModelConfig& c) {
    if (!arch.rope_freqs || !t.has("rope_freqs.weight")) return Status();
    DS_ASSIGN_OR_RETURN(c.rope_freq_factors, t.vector("rope_freqs.weight", c.head_dim / 2));
    for (float f : c.rope_freq_factors) {
        if (!(std::isfinite(f) && f > 0.0f)) {
            return invalid_argument(g.path() + ": rope_freqs.weight holds " + std::to_string(f) +
                                    " (each factor must be finite and > 0)");
        }
    }
    c.rope_scaling = c.rope_scaling == "linear" ? "llama3+linear" : "llama3";
    return Status();
}

Status read_layer(const GgufFile& g, GgufTensors& t, const ModelConfig& c, int32_t i,
                  LayerWeights& l) {
    const std::string p = "blk." + std::to_string(i) + ".";
    DS_ASSIGN_OR_RETURN(l.attn_norm, t.vector(p + "attn_norm.weight", c.d_model));
    DS_ASSIGN_OR_RETURN(l.wq, t.matrix(p + "attn_q.weight", c.q_dim(), c.d_model));
    DS_ASSIGN_OR_RETURN(l.wk, t.matrix(p + "attn_k.weight", c.kv_dim(), c.d_model));
    DS_ASSIGN_OR_RETURN(l.wv, t.matrix(p + "attn_v.weight", c.kv_dim(), c.d_model));
    DS_ASSIGN_OR_RETURN(l.wo, t.matrix(p + "attn_output.weight", c.d_model, c.q_dim()));
    DS_ASSIGN_OR_RETURN(l.bq, t.vector(p + "attn_q.bias", c.q_dim(), true));
    DS_ASSIGN_OR_RETURN(l.bk, t.vector(p + "attn_k.bias", c.kv_dim(), true));
    DS_ASSIGN_OR_RETURN(l.bv, t.vector(p + "attn_v.bias", c.kv_dim(), true));
    if (l.bq.empty() != l.bk.empty() || l.bq.empty() != l.bv.empty()) {
        return invalid_argument(g.path() + ": layer " + std::to_string(i) +
                                " has some but not all of the q/k/v biases");
    }
    if (c.qk_norm) {
        DS_ASSIGN_OR_RETURN(l.q_norm, t.vector(p + "attn_q_norm.weight", c.head_dim));
        DS_ASSIGN_OR_RETURN(l.k_norm, t.vector(p + "attn_k_norm.weight", c.head_dim));
    }
    if (c.post_norms) {
        DS_ASSIGN_OR_RETURN(l.attn_post_norm,
                            t.vector(p + "post_attention_norm.weight", c.d_model));
        DS_ASSIGN_OR_RETURN(l.ffn_post_norm, t.vector(p + "post_ffw_norm.weight", c.d_model));
    }
    DS_ASSIGN_OR_RETURN(l.ffn_norm, t.vector(p + "ffn_norm.weight", c.d_model));
    DS_ASSIGN_OR_RETURN(l.w_gate, t.matrix(p + "ffn_gate.weight", c.d_ff, c.d_model));
    DS_ASSIGN_OR_RETURN(l.w_up, t.matrix(p + "ffn_up.weight", c.d_ff, c.d_model));
    DS_ASSIGN_OR_RETURN(l.w_down, t.matrix(p + "ffn_down.weight", c.d_model, c.d_ff));
    return Status();
}

Status read_weights(const GgufFile& g, const GgufArch& arch, ModelConfig& c, ModelWeights& w) {
    GgufTensors t(g);
    DS_ASSIGN_OR_RETURN(w.token_embd, t.matrix("token_embd.weight", c.n_vocab, c.d_model));
    DS_ASSIGN_OR_RETURN(w.output_norm, t.vector("output_norm.weight", c.d_model));
    if (c.tied_output) {
        w.output = w.token_embd;
    } else {
        DS_ASSIGN_OR_RETURN(w.output, t.matrix("output.weight", c.n_vocab, c.d_model));
    }
    DS_RETURN_IF_ERROR(read_rope_freqs(g, arch, t, c));
    // Layer by layer, not resized up front: block_count may be anything up to 2^30, and
    // only the file's tensors say how many layers there are.
    w.layers.clear();
    for (int32_t i = 0; i < c.n_layers; ++i) {
        DS_RETURN_IF_ERROR(read_layer(g, t, c, i, w.layers.emplace_back()));
    }
    c.qkv_bias = !w.layers.empty() && !w.layers[0].bq.empty();
    return t.all_taken(c.arch);
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
        if (types.size() != v.tokens.size())
            return data_loss(g.path() + ": token_type length mismatch");
        for (int32_t t : types) v.types.push_back(static_cast<TokenType>(t));
    }
    if (g.has("tokenizer.ggml.scores")) {
        DS_ASSIGN_OR_RETURN(v.scores, g.get_float_array("tokenizer.ggml.scores"));
        if (v.scores.size() != v.tokens.size())
            return data_loss(g.path() + ": scores length mismatch");
    }
    auto id = [&](const char* key) -> int32_t {
        auto r = g.get_int(key);
        return r && *r >= 0 && *r < static_cast<int64_t>(v.tokens.size()) ? static_cast<int32_t>(*r)
                                                                          : -1;
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
        v.nfc = v.pre == "qwen2";  // Qwen2's tokenizer.json normalizes to NFC; llama.cpp does not
        v.add_bos = false;
        if (auto b = g.get_bool("tokenizer.ggml.add_bos_token")) v.add_bos = *b;
        return make_bpe_tokenizer(std::move(v));
    }
    if (kind == "llama") {
        v.add_bos = true;
        if (auto b = g.get_bool("tokenizer.ggml.add_bos_token")) v.add_bos = *b;
        if (auto b = g.get_bool("tokenizer.ggml.add_space_prefix")) v.add_space_prefix = *b;
        if (auto arch = g.get_string("general.architecture")) {
            v.merges_by_position = arch->rfind("gemma", 0) == 0;
        }
        return make_spm_tokenizer(std::move(v));
    }
    return unimplemented(g.path() + ": tokenizer model '" + kind +
                         "' is not supported (gpt2, llama are)");
}

Result<std::unique_ptr<Tokenizer>> load_gguf_tokenizer(const std::string& path) {
    DS_ASSIGN_OR_RETURN(GgufFile g, GgufFile::open(path));
    return gguf_tokenizer(g);
}

Result<std::unique_ptr<Model>> load_gguf_model(const std::string& path,
                                               const LoadOptions& options) {
    DS_ASSIGN_OR_RETURN(GgufFile g, GgufFile::open(path));
    auto model = std::make_unique<Model>();
    DS_ASSIGN_OR_RETURN(const GgufArch* arch, find_gguf_arch(g));
    DS_RETURN_IF_ERROR(read_gguf_config(g, *arch, model->config));
    DS_RETURN_IF_ERROR(read_vocab(g, model->config));
    DS_RETURN_IF_ERROR(read_weights(g, *arch, model->config, model->weights));
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
        const Tokenizer& tok = *model->tokenizer;
        model->chat_template = ChatTemplate::from_jinja(
            *tmpl, special_token_text(tok, tok.bos_id()), special_token_text(tok, tok.eos_id()));
        if (!model->chat_template.status().ok()) {
            // Completion still works; chat requests get this error.
            spdlog::warn("{}: the chat template cannot be used: {}", path,
                         model->chat_template.status().message());
        }
    }
    prefault(g, options.show_progress);
    model->format = "gguf";
    model->weights.files.push_back(g.release_mapping());
    return model;
}

}  // namespace deltaserve::model
