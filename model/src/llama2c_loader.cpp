// llama2.c checkpoints (karpathy/llama2.c run.c format, version 0): a header of seven
// int32 values, then fp32 weights in a fixed order. Weights stay in the mapping.
#include <cstdint>
#include <cstring>
#include <string>

#include "deltaserve/common/logging.h"
#include "deltaserve/model/model.h"
#include "loader_common.h"

namespace deltaserve::model {

namespace {

struct Llama2cHeader {
    int32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
};

}  // namespace

Result<std::unique_ptr<Model>> load_llama2c_model(const std::string& path,
                                                  const LoadOptions& options) {
    DS_ASSIGN_OR_RETURN(MappedFile file, MappedFile::open(path));
    Llama2cHeader h{};
    if (file.size() < sizeof(h)) return data_loss(path + ": too small for a llama2.c checkpoint");
    std::memcpy(&h, file.data(), sizeof(h));
    const bool shared_classifier = h.vocab_size > 0;
    // INT32_MIN has no negation: 0, which is refused below.
    const int32_t vocab = shared_classifier           ? h.vocab_size
                          : h.vocab_size == INT32_MIN ? 0
                                                      : -h.vocab_size;
    const auto plausible = [](int32_t v, int32_t hi) { return v > 0 && v <= hi; };
    if (!plausible(h.dim, 1 << 16) || !plausible(h.hidden_dim, 1 << 18) ||
        !plausible(h.n_layers, 1024) || !plausible(h.n_heads, 1024) ||
        !plausible(h.n_kv_heads, 1024) || !plausible(vocab, 1 << 22) ||
        !plausible(h.seq_len, 1 << 24) || h.dim % h.n_heads != 0 || h.n_heads % h.n_kv_heads != 0) {
        return invalid_argument(path + ": not a GGUF file, a Hugging Face directory or a "
                                       "llama2.c checkpoint (implausible header)");
    }
    const int64_t head = h.dim / h.n_heads;
    const int64_t kv_dim = head * h.n_kv_heads;
    const int64_t L = h.n_layers, D = h.dim, F = h.hidden_dim;
    const int64_t n_floats = vocab * D + L * D + L * D * D + 2 * L * D * kv_dim + L * D * D +
                             L * D + 3 * L * F * D + D + h.seq_len * head +
                             (shared_classifier ? 0 : vocab * D);
    const size_t need = sizeof(h) + static_cast<size_t>(n_floats) * sizeof(float);
    if (file.size() < need) {
        return data_loss(path + ": truncated llama2.c checkpoint (" + std::to_string(file.size()) +
                         " bytes, header implies " + std::to_string(need) + ")");
    }
    if (head % 2 != 0) return unimplemented(path + ": odd head size");

    auto model = std::make_unique<Model>();
    ModelConfig& c = model->config;
    c.arch = "llama";
    c.name = path.substr(path.find_last_of('/') + 1);
    c.n_vocab = vocab;
    c.d_model = h.dim;
    c.n_layers = h.n_layers;
    c.n_heads = h.n_heads;
    c.n_kv_heads = h.n_kv_heads;
    c.head_dim = static_cast<int32_t>(head);
    c.d_ff = h.hidden_dim;
    c.n_ctx_train = h.seq_len;
    c.rms_eps = 1e-5f;
    c.rope_theta = 10000.0f;
    c.rope_style = kernels::RopeStyle::kInterleaved;
    c.tied_output = shared_classifier;

    const auto* p = reinterpret_cast<const float*>(file.data() + sizeof(h));
    auto matrix = [&](int64_t rows, int64_t cols) {
        kernels::WeightMatrix m{kernels::DType::kF32, rows, cols, p};
        p += rows * cols;
        return m;
    };
    auto vec = [&](int64_t n) {
        std::vector<float> v(p, p + n);
        p += n;
        return v;
    };
    ModelWeights& w = model->weights;
    w.token_embd = matrix(vocab, D);
    w.layers.resize(static_cast<size_t>(L));
    for (auto& l : w.layers) l.attn_norm = vec(D);
    for (auto& l : w.layers) l.wq = matrix(D, D);
    for (auto& l : w.layers) l.wk = matrix(kv_dim, D);
    for (auto& l : w.layers) l.wv = matrix(kv_dim, D);
    for (auto& l : w.layers) l.wo = matrix(D, D);
    for (auto& l : w.layers) l.ffn_norm = vec(D);
    for (auto& l : w.layers) l.w_gate = matrix(F, D);  // w1
    for (auto& l : w.layers) l.w_down = matrix(D, F);  // w2
    for (auto& l : w.layers) l.w_up = matrix(F, D);    // w3
    w.output_norm = vec(D);
    p += h.seq_len * head;  // freq_cis_real and freq_cis_imag: RoPE is computed instead
    w.output = shared_classifier ? w.token_embd : matrix(vocab, D);
    w.files.push_back(std::move(file));

    model->format = "llama2c";
    if (!options.tokenizer_path.empty()) {
        DS_ASSIGN_OR_RETURN(model->tokenizer, load_tokenizer_file(options.tokenizer_path, vocab));
    } else {
        spdlog::info("{}: llama2.c checkpoints carry no tokenizer; pass --tokenizer", path);
    }
    return model;
}

}  // namespace deltaserve::model
