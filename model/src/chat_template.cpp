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

namespace {

// Appends to segments, merging adjacent text.
class SegmentWriter {
  public:
    void special(std::string_view marker) { out_.push_back({std::string(marker), true}); }
    SegmentWriter& text(std::string_view t) {
        if (t.empty()) return *this;
        if (out_.empty() || out_.back().special) out_.push_back({"", false});
        out_.back().text.append(t);
        return *this;
    }
    std::vector<ChatSegment> take() { return std::move(out_); }

  private:
    std::vector<ChatSegment> out_;
};

}  // namespace

std::vector<ChatSegment> render_chat_template(const ChatTemplate& tmpl,
                                              const std::vector<ChatMessage>& messages,
                                              bool add_generation_prompt) {
    SegmentWriter w;
    switch (tmpl.kind) {
        case ChatTemplateKind::kChatML: {
            auto turn = [&](std::string_view role, std::string_view content) {
                w.special(kImStart);
                w.text(role).text("\n").text(content);
                w.special(kImEnd);
                w.text("\n");
            };
            // The template adds its system prompt inside the message loop, so only when
            // there is at least one message.
            if (!messages.empty() && messages[0].role != "system" && !tmpl.default_system.empty()) {
                turn("system", tmpl.default_system);
            }
            for (const ChatMessage& m : messages) turn(m.role, m.content);
            if (add_generation_prompt) {
                w.special(kImStart);
                w.text("assistant\n");
            }
            break;
        }
        case ChatTemplateKind::kLlama3: {
            auto header = [&](std::string_view role) {
                w.special(kHeaderStart);
                w.text(role);
                w.special(kHeaderEnd);
                w.text("\n\n");
            };
            if (!tmpl.bos_text.empty()) w.special(tmpl.bos_text);
            if (!messages.empty() && messages[0].role != "system" && !tmpl.default_system.empty()) {
                header("system");
                w.text(trim(tmpl.default_system));
                w.special(kEotId);
            }
            for (const ChatMessage& m : messages) {
                header(m.role);
                w.text(trim(m.content));  // the template trims content
                w.special(kEotId);
            }
            if (add_generation_prompt) header("assistant");
            break;
        }
    }
    return w.take();
}

std::string apply_chat_template(const ChatTemplate& tmpl, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt) {
    std::string out;
    for (const ChatSegment& s : render_chat_template(tmpl, messages, add_generation_prompt)) {
        out += s.text;
    }
    return out;
}

Result<std::vector<int32_t>> encode_chat(const Tokenizer& tokenizer, const ChatTemplate& tmpl,
                                         const std::vector<ChatMessage>& messages,
                                         bool add_generation_prompt) {
    // A marker the vocabulary has no single token for is text, as it was when the whole
    // prompt was encoded at once: it joins the text around it.
    std::vector<ChatSegment> segments;
    for (ChatSegment& s : render_chat_template(tmpl, messages, add_generation_prompt)) {
        if (s.special) {
            auto ids = tokenizer.encode(s.text, false, true);
            if (!ids.ok()) return ids.status();
            s.special = ids->size() == 1;
        }
        if (!s.special && !segments.empty() && !segments.back().special) {
            segments.back().text += s.text;
        } else {
            segments.push_back(std::move(s));
        }
    }
    std::vector<int32_t> ids;
    if (tokenizer.vocab().add_bos && tokenizer.bos_id() >= 0) ids.push_back(tokenizer.bos_id());
    for (const ChatSegment& s : segments) {
        DS_ASSIGN_OR_RETURN(const std::vector<int32_t> part,
                            tokenizer.encode(s.text, false, s.special));
        ids.insert(ids.end(), part.begin(), part.end());
    }
    return ids;
}

}  // namespace deltaserve::model
