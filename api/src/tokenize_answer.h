// POST /tokenize and /detokenize as llama-server and vLLM answer them (and vLLM's
// GET /tokenizer_info): text (llama-server's
// `content`, vLLM's `prompt`) or a chat (`messages`, rendered as a turn is, with
// `add_generation_prompt`) to token ids, and ids back to text.
#pragma once

#include <string>
#include <string_view>

#include "deltaserve/common/status.h"
#include "deltaserve/model/model.h"

namespace deltaserve::api {

// {"tokens": [...], "count": n, "max_model_len": the model's trained context}; with
// llama-server's with_pieces, each token {"id", "piece"} (the piece as text where it is
// valid UTF-8, else its bytes). add_special (llama-server; default false) or
// add_special_tokens (vLLM; default true) adds BOS where the vocabulary has one; control
// tokens written in the text are parsed, as both do. Errors (kInvalidArgument) name the
// field.
Result<std::string> tokenize_answer(const model::Model& model, std::string_view body);

// {"content": text, "prompt": text} for {"tokens": [ids]} (each in the vocabulary).
Result<std::string> detokenize_answer(const model::Model& model, std::string_view body);

// GET /tokenizer_info as vLLM answers it (lm-evaluation-harness's remote tokenizer reads
// it): bos_token, eos_token, pad_token and unk_token (their text, null when the vocabulary
// has none), add_bos_token, chat_template (the model's own source, null for the default
// ChatML), model_max_length (the trained context) and tokenizer_class.
std::string tokenizer_info_answer(const model::Model& model);

}  // namespace deltaserve::api
