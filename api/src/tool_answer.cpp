#include "tool_answer.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "random_id.h"

namespace deltaserve::api {

namespace {

using json = nlohmann::ordered_json;

bool alnum(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

// An id for a call: OpenAI's "call_" and 24 characters; Mistral's templates take only 9
// letters and digits, and keep the model's own where it wrote one of those.
std::string call_id(model::ToolCallFormat format, const std::string& written) {
    if (format != model::ToolCallFormat::kMistral) return random_id("call_", 12);
    if (written.size() == 9 && std::all_of(written.begin(), written.end(), alnum)) return written;
    return random_id("", 5).substr(0, 9);
}

}  // namespace

Status check_tools_servable(const model::ChatTemplate& tmpl) {
    if (!tmpl.renders_tools()) {
        return invalid_argument(
            "'tools': this model's chat template does not show tools to the model (give one "
            "that does with --chat-template)");
    }
    if (tmpl.tool_call_format() == model::ToolCallFormat::kNone) {
        const std::string& known = tmpl.unparsed_tool_format();
        return invalid_argument(
            "'tools': " +
            (known.empty() ? std::string("this model's chat template names no tool-call format "
                                         "this server reads")
                           : "this model writes tool calls in the " + known +
                                 " format, which this server does not read") +
            " (start it with --tool-call-parser hermes, llama3_json or mistral if the model "
            "writes one of those)");
    }
    return Status();
}

std::vector<int32_t> tool_call_tokens(const model::Tokenizer& tokenizer,
                                      model::ToolCallFormat format) {
    std::vector<int32_t> ids;
    const model::Vocab& v = tokenizer.vocab();
    for (const std::string& text : model::tool_call_control_texts(format)) {
        for (size_t i = 0; i < v.tokens.size() && i < v.types.size(); ++i) {
            if (v.types[i] == model::TokenType::kControl && v.tokens[i] == text)
                ids.push_back(static_cast<int32_t>(i));
        }
    }
    return ids;
}

model::ChatMessage assistant_message(const std::string& content,
                                     const std::vector<model::ToolCall>& calls) {
    if (calls.empty()) return {"assistant", content};
    json list = json::array();
    for (const model::ToolCall& c : calls) {
        json args = json::parse(c.arguments, nullptr, /*allow_exceptions=*/false);
        if (args.is_discarded()) args = json::object();  // never: the parser wrote it
        list.push_back({{"id", c.id},
                        {"type", "function"},
                        {"function", {{"name", c.name}, {"arguments", std::move(args)}}}});
    }
    json m = {{"role", "assistant"},
              {"content", content.empty() ? json() : json(content)},
              {"tool_calls", std::move(list)}};
    return {"assistant", content, m.dump(-1, ' ', false, json::error_handler_t::replace)};
}

ToolAnswer::ToolAnswer(model::ToolCallFormat format, bool parallel, const TurnCallbacks& callbacks)
    : format_(format), parser_(format, parallel), callbacks_(callbacks) {}

bool ToolAnswer::feed(std::string_view piece) { return deliver(parser_.feed(piece)); }

bool ToolAnswer::finish() { return deliver(parser_.finish()); }

bool ToolAnswer::deliver(model::ToolCallParser::Step step) {
    bool go_on = true;
    if (!step.content.empty()) {
        if (format_ != model::ToolCallFormat::kNone) content_ += step.content;  // else unused
        go_on = callbacks_.on_piece(step.content);
    }
    for (model::ToolCall& call : step.calls) {
        call.id = call_id(format_, call.id);
        const int index = static_cast<int>(calls_.size());
        calls_.push_back(std::move(call));
        if (go_on && callbacks_.on_tool_call) go_on = callbacks_.on_tool_call(index, calls_.back());
    }
    return go_on;
}

}  // namespace deltaserve::api
