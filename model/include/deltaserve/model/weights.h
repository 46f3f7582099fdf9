// The weights of a model, pointing into memory-mapped files where the format allows.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "deltaserve/common/mapped_file.h"
#include "deltaserve/kernels/dtype.h"

namespace deltaserve::model {

using kernels::WeightMatrix;

struct LayerWeights {
    std::vector<float> attn_norm;       // d_model
    WeightMatrix wq;                    // q_dim x d_model
    WeightMatrix wk;                    // kv_dim x d_model
    WeightMatrix wv;                    // kv_dim x d_model
    WeightMatrix wo;                    // d_model x q_dim
    std::vector<float> bq, bk, bv;      // Qwen2 biases; empty otherwise
    std::vector<float> q_norm;          // Qwen3: head_dim, each head of q; empty otherwise
    std::vector<float> k_norm;          // Qwen3: head_dim, each head of k; empty otherwise
    std::vector<float> attn_post_norm;  // Gemma 3: d_model, the attention's output; or empty
    std::vector<float> ffn_post_norm;   // Gemma 3: d_model, the FFN's output; or empty
    std::vector<float> ffn_norm;        // d_model
    WeightMatrix w_gate;                // d_ff x d_model
    WeightMatrix w_up;                  // d_ff x d_model
    WeightMatrix w_down;                // d_model x d_ff
};

struct ModelWeights {
    WeightMatrix token_embd;  // n_vocab x d_model (rows are looked up)
    std::vector<float> output_norm;
    WeightMatrix output;  // n_vocab x d_model; equals token_embd when tied
    std::vector<LayerWeights> layers;

    // Keep-alive storage behind the WeightMatrix pointers.
    std::vector<MappedFile> files;
    struct FreeDeleter {
        void operator()(uint8_t* p) const;
    };
    std::vector<std::unique_ptr<uint8_t, FreeDeleter>> buffers;

    // Allocates a zeroed 64-byte aligned buffer that lives as long as the weights.
    uint8_t* allocate(size_t bytes);

    // Repacks every matrix the matmul kernels take interleaved (kernels::repackable) into
    // buffers of its own, as ggml's CPU repack does; a tied output stays tied. The mapped
    // pages the matrices came from are given back.
    void repack();
};

}  // namespace deltaserve::model
