// Chat templates: the framing that turns a conversation into a prompt.
//
// The model's own Jinja template (GGUF tokenizer.chat_template, HF tokenizer_config.json or
// chat_template.jinja, or a file the operator names) rendered by jinja::JinjaTemplate as
// transformers' apply_chat_template renders it, with its variables: messages, tools,
// add_generation_prompt, bos_token, eos_token, the request's chat_template_kwargs, and the
// globals raise_exception and strftime_now. A model without a template gets ChatML, as
// llama.cpp gives it.
#pragma once

#include <ctime>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "deltaserve/common/status.h"
#include "deltaserve/model/jinja_value.h"
#include "deltaserve/model/tokenizer.h"
#include "deltaserve/model/tool_calls.h"

namespace deltaserve::model {

namespace jinja {
class JinjaTemplate;
}

struct ChatMessage {
    std::string role;  // "system", "user", "assistant", "tool", ...
    std::string content;
    // The whole message as the API received it, a JSON object (content parts, tool_calls,
    // tool_call_id, name, reasoning_content ...); "" for {role, content} alone.
    std::string json;
};

// What a request adds to the rendering.
struct ChatRenderOptions {
    bool add_generation_prompt = true;
    std::string tools_json;   // a JSON array of tools; "" = none (the variable undefined)
    std::string kwargs_json;  // a JSON object of extra variables (enable_thinking ...); ""
    std::time_t now = -1;     // strftime_now's clock; default: now
};

class ChatTemplate {
  public:
    // ChatML without a system prompt, for a model whose file carries no template.
    ChatTemplate();
    // A model's template with the text of its BOS and EOS tokens. A template that does not
    // parse still makes a ChatTemplate: render() then fails with kFailedPrecondition and
    // the parse error (naming the line and the construct), so chat is refused while
    // completion still works.
    static ChatTemplate from_jinja(std::string source, std::string bos_token,
                                   std::string eos_token);

    const std::string& source() const { return source_; }
    bool is_default() const { return is_default_; }
    // OK, or why the template cannot be used.
    Status status() const { return status_; }

    // Whether the template renders a request's tools (its text reads the variable `tools`).
    bool renders_tools() const { return renders_tools_; }
    // The format the template teaches its model to call tools in, detected from its text
    // (detect_tool_call_format); where that is kNone, the known format it names instead
    // ("" if none). An operator's --tool-call-parser sets it.
    ToolCallFormat tool_call_format() const { return tool_format_; }
    const std::string& unparsed_tool_format() const { return tool_unparsed_; }
    void set_tool_call_format(ToolCallFormat format) {
        tool_format_ = format;
        tool_unparsed_.clear();
    }

    // The prompt, its bytes from the messages and tools marked as input (JinjaText::input).
    // Errors: kInvalidArgument for a template error, a refused construct or what the
    // template raises ("chat template: ..."); kResourceExhausted past the render bounds.
    Result<jinja::JinjaText> render(const std::vector<ChatMessage>& messages,
                                    const ChatRenderOptions& options) const;

  private:
    std::shared_ptr<const jinja::JinjaTemplate> template_;
    std::string source_, bos_, eos_;
    bool is_default_ = true;
    Status status_;
    bool renders_tools_ = false;
    ToolCallFormat tool_format_ = ToolCallFormat::kNone;
    std::string tool_unparsed_;
};

// The prompt as text, for display and tests.
Result<std::string> apply_chat_template(const ChatTemplate& tmpl,
                                        const std::vector<ChatMessage>& messages,
                                        bool add_generation_prompt);

// The prompt's token ids: control tokens are taken from the template's own text only; the
// messages' and tools' text is tokenized as plain text, so a user who writes
// "<|im_start|>system" gets those characters, not a forged turn. BOS first when the
// vocabulary adds one and the template has not written it.
// Errors: render()'s, and the tokenizer's (kInvalidArgument for text that is not UTF-8).
Result<std::vector<int32_t>> encode_chat(const Tokenizer& tokenizer, const ChatTemplate& tmpl,
                                         const std::vector<ChatMessage>& messages,
                                         const ChatRenderOptions& options);
Result<std::vector<int32_t>> encode_chat(const Tokenizer& tokenizer, const ChatTemplate& tmpl,
                                         const std::vector<ChatMessage>& messages,
                                         bool add_generation_prompt);

// The text of a vocabulary's token for bos_token / eos_token ("" when it has none).
std::string special_token_text(const Tokenizer& tokenizer, int32_t id);

}  // namespace deltaserve::model
