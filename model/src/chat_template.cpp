#include "deltaserve/model/chat_template.h"

#include <string>

namespace deltaserve::model {
namespace {

constexpr std::string_view kImStart = "<|im_start|>";
constexpr std::string_view kImEnd = "<|im_end|>";
constexpr std::string_view kHeaderStart = "<|start_header_id|>";
constexpr std::string_view kHeaderEnd = "<|end_header_id|>";
constexpr std::string_view kEotId = "<|eot_id|>";
constexpr std::string_view kBeginOfText = "<|begin_of_text|>";

// A system prompt written literally in a ChatML template, as SmolLM2's and Qwen2's carry:
// "<|im_start|>system\n<literal text><|im_end|>" where the newline may be written as "\n"
// inside a Jinja string. Text containing Jinja syntax or quotes is not a literal.
std::string literal_default_system(std::string_view jinja) {
    const std::string opener = std::string(kImStart) + "system";
    for (size_t pos = jinja.find(opener); pos != std::string_view::npos;
         pos = jinja.find(opener, pos + 1)) {
        size_t start = pos + opener.size();
        if (jinja.substr(start, 1) == "\n") {
            start += 1;
        } else if (jinja.substr(start, 2) == "\\n") {
            start += 2;
        } else {
            continue;
        }
        const size_t end = jinja.find(kImEnd, start);
        if (end == std::string_view::npos) continue;
        const std::string_view text = jinja.substr(start, end - start);
        if (text.empty() || text.find_first_of("'\"{}") != std::string_view::npos) continue;
        return std::string(text);
    }
    return {};
}

std::string_view trim(std::string_view s) {
    const char* ws = " \t\n\r\f\v";
    const size_t first = s.find_first_not_of(ws);
    if (first == std::string_view::npos) return {};
    return s.substr(first, s.find_last_not_of(ws) - first + 1);
}

}  // namespace

Result<ChatTemplate> detect_chat_template(std::string_view jinja) {
    ChatTemplate tmpl;
    if (jinja.empty()) return tmpl;  // plain ChatML
    if (jinja.find(kImStart) != std::string_view::npos) {
        tmpl.kind = ChatTemplateKind::kChatML;
        tmpl.default_system = literal_default_system(jinja);
        return tmpl;
    }
    if (jinja.find(kHeaderStart) != std::string_view::npos &&
        jinja.find(kEotId) != std::string_view::npos) {
        tmpl.kind = ChatTemplateKind::kLlama3;
        tmpl.bos_text = std::string(kBeginOfText);
        return tmpl;
    }
    return unimplemented("unrecognised chat template (known: ChatML, Llama-3): " +
                         std::string(jinja.substr(0, 120)));
}

std::string apply_chat_template(const ChatTemplate& tmpl, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt) {
    std::string out;
    switch (tmpl.kind) {
        case ChatTemplateKind::kChatML: {
            auto turn = [&](std::string_view role, std::string_view content) {
                out.append(kImStart).append(role).append("\n");
                out.append(content).append(kImEnd).append("\n");
            };
            // The template adds its system prompt inside the message loop, so only when
            // there is at least one message.
            if (!messages.empty() && messages[0].role != "system" && !tmpl.default_system.empty()) {
                turn("system", tmpl.default_system);
            }
            for (const ChatMessage& m : messages) turn(m.role, m.content);
            if (add_generation_prompt) out.append(kImStart).append("assistant\n");
            break;
        }
        case ChatTemplateKind::kLlama3: {
            auto header = [&](std::string_view role) {
                out.append(kHeaderStart).append(role).append(kHeaderEnd).append("\n\n");
            };
            out += tmpl.bos_text;
            if (!messages.empty() && messages[0].role != "system" && !tmpl.default_system.empty()) {
                header("system");
                out.append(trim(tmpl.default_system)).append(kEotId);
            }
            for (const ChatMessage& m : messages) {
                header(m.role);
                out.append(trim(m.content)).append(kEotId);  // the template trims content
            }
            if (add_generation_prompt) header("assistant");
            break;
        }
    }
    return out;
}

}  // namespace deltaserve::model
