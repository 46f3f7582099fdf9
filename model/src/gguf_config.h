// A GGUF file's hyperparameters as a ModelConfig (private to model/).
#pragma once

#include "deltaserve/common/status.h"
#include "deltaserve/model/model_config.h"
#include "gguf_file.h"

namespace deltaserve::model {

// What an architecture's tensors hold beyond the Llama graph.
struct GgufArch {
    const char* name;
    kernels::RopeStyle rope_style;  // llama.cpp's rope type for it (NORM or NEOX)
    bool rope_freqs;                // reads rope_freqs.weight (llama3 scaling)
    bool qk_norm;                   // blk.N.attn_q_norm / attn_k_norm (Qwen3, Gemma 3)
    bool gemma;  // Gemma 3's graph (ModelConfig): post norms, GeGLU, sliding-window layers
};

// The architecture general.architecture names; kUnimplemented for one deltaserve lacks.
Result<const GgufArch*> find_gguf_arch(const GgufFile& g);

// Reads every `<arch>.*` key into c (all but n_vocab, tied_output and the tensors' own
// parts: rope_freq_factors). A key deltaserve does not implement is refused naming it when
// it may change the result (scaling types but none and linear, softcapping, sliding
// windows, experts, ...); out-of-range values (NaN, zero heads, head sizes that do not
// divide) are kInvalidArgument.
Status read_gguf_config(const GgufFile& g, const GgufArch& arch, ModelConfig& c);

}  // namespace deltaserve::model
