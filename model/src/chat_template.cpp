#include "deltaserve/model/chat_template.h"

#include <nlohmann/json.hpp>

#include "deltaserve/model/jinja.h"

namespace deltaserve::model {
namespace {

// llama.cpp's fallback for a model without a template: ChatML, no system prompt.
constexpr const char* kChatML =
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}";

Result<jinja::Value> message_value(const ChatMessage& m) {
    if (!m.json.empty()) {
        DS_ASSIGN_OR_RETURN(jinja::Value v, jinja::value_from_json(m.json, /*from_input=*/true));
        if (!v.is_dict()) return invalid_argument("a chat message must be a JSON object");
        return v;
    }
    jinja::Dict d;
    d.set("role", jinja::Value::input(m.role));
    d.set("content", jinja::Value::input(m.content));
    return jinja::Value::dict(std::move(d));
}

}  // namespace

ChatTemplate::ChatTemplate() {
    auto t = jinja::JinjaTemplate::parse(kChatML);
    template_ = std::make_shared<const jinja::JinjaTemplate>(std::move(*t));
    source_ = kChatML;
}

ChatTemplate ChatTemplate::from_jinja(std::string source, std::string bos_token,
                                      std::string eos_token) {
    ChatTemplate t;
    t.is_default_ = false;
    t.bos_ = std::move(bos_token);
    t.eos_ = std::move(eos_token);
    auto parsed = jinja::JinjaTemplate::parse(source);
    if (parsed.has_value()) {
        t.template_ = std::make_shared<const jinja::JinjaTemplate>(std::move(*parsed));
    } else {
        t.template_.reset();
        t.status_ = failed_precondition("the model's chat template cannot be used: " +
                                        parsed.error().message());
    }
    t.renders_tools_ = source.find("tools") != std::string::npos;
    t.tool_format_ = detect_tool_call_format(source, &t.tool_unparsed_);
    t.source_ = std::move(source);
    return t;
}

Result<jinja::JinjaText> ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                              const ChatRenderOptions& options) const {
    if (!status_.ok()) return status_;
    jinja::Dict ctx;
    if (!options.kwargs_json.empty()) {
        DS_ASSIGN_OR_RETURN(jinja::Value kw, jinja::value_from_json(options.kwargs_json, true));
        if (!kw.is_dict()) return invalid_argument("chat_template_kwargs must be a JSON object");
        for (const auto& [k, v] : kw.entries().entries()) ctx.set(k, v);
    }
    jinja::ValueList list;
    for (const ChatMessage& m : messages) {
        DS_ASSIGN_OR_RETURN(jinja::Value v, message_value(m));
        list.push_back(std::move(v));
    }
    // The request's own variables win over chat_template_kwargs, as in vLLM.
    ctx.set("messages", jinja::Value::list(std::move(list)));
    if (!options.tools_json.empty()) {
        DS_ASSIGN_OR_RETURN(jinja::Value tools, jinja::value_from_json(options.tools_json, true));
        ctx.set("tools", std::move(tools));
    }
    ctx.set("add_generation_prompt", jinja::Value::boolean(options.add_generation_prompt));
    ctx.set("bos_token", jinja::Value::literal(bos_));
    ctx.set("eos_token", jinja::Value::literal(eos_));
    jinja::RenderOptions ro;
    ro.now = options.now;
    return template_->render(jinja::Value::dict(std::move(ctx)), ro);
}

Result<std::string> apply_chat_template(const ChatTemplate& tmpl,
                                        const std::vector<ChatMessage>& messages,
                                        bool add_generation_prompt) {
    ChatRenderOptions o;
    o.add_generation_prompt = add_generation_prompt;
    DS_ASSIGN_OR_RETURN(jinja::JinjaText t, tmpl.render(messages, o));
    return std::move(t.text);
}

std::string special_token_text(const Tokenizer& tokenizer, int32_t id) {
    if (id < 0 || id >= tokenizer.vocab_size()) return "";
    return tokenizer.token_to_piece(id, -1, /*render_special=*/true);
}

Result<std::vector<int32_t>> encode_chat(const Tokenizer& tokenizer, const ChatTemplate& tmpl,
                                         const std::vector<ChatMessage>& messages,
                                         const ChatRenderOptions& options) {
    DS_ASSIGN_OR_RETURN(jinja::JinjaText prompt, tmpl.render(messages, options));
    DS_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                        tokenizer.encode_prompt(prompt.text, false, prompt.input));
    const int32_t bos = tokenizer.bos_id();
    if (tokenizer.vocab().add_bos && bos >= 0 && (ids.empty() || ids[0] != bos)) {
        ids.insert(ids.begin(), bos);
    }
    return ids;
}

Result<std::vector<int32_t>> encode_chat(const Tokenizer& tokenizer, const ChatTemplate& tmpl,
                                         const std::vector<ChatMessage>& messages,
                                         bool add_generation_prompt) {
    ChatRenderOptions o;
    o.add_generation_prompt = add_generation_prompt;
    return encode_chat(tokenizer, tmpl, messages, o);
}

}  // namespace deltaserve::model
