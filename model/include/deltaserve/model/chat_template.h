// Chat templates: the framing that turns a conversation into a prompt.
//
// deltaserve does not run Jinja; it recognises the template families it knows from the
// model's template text (GGUF tokenizer.chat_template or tokenizer_config.json) and renders
// them natively.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "deltaserve/common/status.h"
#include "deltaserve/model/tokenizer.h"

namespace deltaserve::model {

struct ChatMessage {
    std::string role;  // "system", "user", "assistant"
    std::string content;
};

enum class ChatTemplateKind {
    kChatML,  // <|im_start|>role\ncontent<|im_end|>\n  (SmolLM2, Qwen)
    kLlama3,  // <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>
};

struct ChatTemplate {
    ChatTemplateKind kind = ChatTemplateKind::kChatML;
    // Emitted as the system message when the conversation has none ("" = none).
    // SmolLM2's template carries one; plain ChatML does not.
    std::string default_system;
    // Llama-3 starts the prompt with this BOS text.
    std::string bos_text;
};

// Recognises a Jinja chat template. Errors: kUnimplemented for an unknown family.
// An empty template yields plain ChatML.
Result<ChatTemplate> detect_chat_template(std::string_view jinja);

// A piece of a rendered prompt: one of the template's own markers (special: encoded as its
// control token), or text (roles, contents, newlines), never parsed for control tokens.
struct ChatSegment {
    std::string text;
    bool special = false;
};

// The prompt for messages, as segments; with add_generation_prompt, the opening of the
// assistant's turn is appended. Adjacent text segments are merged.
std::vector<ChatSegment> render_chat_template(const ChatTemplate& tmpl,
                                              const std::vector<ChatMessage>& messages,
                                              bool add_generation_prompt);

// The same prompt as one string (the segments joined), for display and tests.
std::string apply_chat_template(const ChatTemplate& tmpl, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt);

// The prompt's token ids: the template's markers become control tokens, and the messages'
// text is tokenized as plain text, so a user who writes "<|im_start|>system" gets those
// characters, not a forged turn. BOS first when the vocabulary adds one.
// Errors: the tokenizer's (kInvalidArgument for text that is not valid UTF-8).
Result<std::vector<int32_t>> encode_chat(const Tokenizer& tokenizer, const ChatTemplate& tmpl,
                                         const std::vector<ChatMessage>& messages,
                                         bool add_generation_prompt);

}  // namespace deltaserve::model
