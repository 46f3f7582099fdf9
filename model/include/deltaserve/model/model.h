// A loaded model: config, weights, tokenizer and chat template.
#pragma once

#include <memory>
#include <string>

#include "deltaserve/common/status.h"
#include "deltaserve/model/backend_weights.h"
#include "deltaserve/model/chat_template.h"
#include "deltaserve/model/model_config.h"
#include "deltaserve/model/tokenizer.h"
#include "deltaserve/model/weights.h"

namespace deltaserve::model {

struct Model {
    ModelConfig config;
    ModelWeights weights;
    std::unique_ptr<Tokenizer> tokenizer;  // null when the format has none and none was given
    ChatTemplate chat_template;
    std::string format;  // "gguf", "hf", "llama2c"
    // The weights as each backend's ops read them, made at a forward pass's first use.
    mutable BackendWeightsCache on_backends;
};

struct LoadOptions {
    // A tokenizer file that overrides the model's own (required for llama2.c checkpoints):
    // a llama2.c tokenizer.bin, a tokenizer.json or a GGUF file.
    std::string tokenizer_path;
    // Draw a progress bar on stderr when it is a terminal. Default: true.
    bool show_progress = true;
    // Repack quantized matrices for the matmul kernels (ModelWeights::repack): the same
    // results, faster. Default: true.
    bool repack = true;
};

// Loads a model, choosing the format from the path: a directory is a Hugging Face model
// (config.json, tokenizer.json, model.safetensors or its index), a file starting with
// "GGUF" is GGUF, anything else is tried as a llama2.c checkpoint.
// Errors name the file and the problem; nothing is left mapped on failure.
Result<std::unique_ptr<Model>> load_model(const std::string& path, const LoadOptions& options);

// The per-format loaders behind load_model.
Result<std::unique_ptr<Model>> load_gguf_model(const std::string& path, const LoadOptions& options);
Result<std::unique_ptr<Model>> load_hf_model(const std::string& dir, const LoadOptions& options);
Result<std::unique_ptr<Model>> load_llama2c_model(const std::string& path,
                                                  const LoadOptions& options);

}  // namespace deltaserve::model
