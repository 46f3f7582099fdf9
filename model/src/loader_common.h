// Helpers shared by the format loaders (private to model/).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "deltaserve/common/status.h"
#include "deltaserve/model/tokenizer.h"

namespace deltaserve::model {

// The tokenizer stored in a GGUF file's metadata (tokenizer.ggml.*).
Result<std::unique_ptr<Tokenizer>> load_gguf_tokenizer(const std::string& path);

// A tokenizer given explicitly (--tokenizer): a tokenizer.json, a GGUF file, or a llama2.c
// tokenizer.bin with n_vocab entries; chosen from the file's contents.
Result<std::unique_ptr<Tokenizer>> load_tokenizer_file(const std::string& path, int32_t n_vocab);

}  // namespace deltaserve::model
