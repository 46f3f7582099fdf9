// Tool calls in a model's answer: the formats models write them in, and a parser that finds
// them in the answer's text as it streams, holding back only what may be a call.
//
// Formats (vLLM's --tool-call-parser names):
//   hermes       <tool_call>{"name": ..., "arguments": {...}}</tool_call>, one or more
//                (Qwen2.5, Qwen3, Hermes 2/3, SmolLM3)
//   llama3_json  {"name": ..., "parameters": {...}} as the whole answer, optionally after
//                <|python_tag|>, several joined by ';' (Llama 3.1, 3.2, 3.3)
//   mistral      [TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}, ...] (v0.3,
//                Nemo), or [TOOL_CALLS]name[CALL_ID]id[ARGS]{...} repeated (Small 3.x,
//                Devstral)
// A call is returned only when its text parses: a name and a JSON object of arguments. Text
// that looked like a call and is not one comes out as content, as the model wrote it.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace deltaserve::model {

enum class ToolCallFormat { kNone, kHermes, kLlama3Json, kMistral };

// "hermes", "llama3_json", "mistral"; nullopt for another name.
std::optional<ToolCallFormat> tool_call_format_named(std::string_view name);
std::string_view tool_call_format_name(ToolCallFormat format);

// The format a chat template teaches its model, from the template's text (as llama.cpp picks
// its parser): kNone where it renders no tools, or renders them in a format not parsed
// here; `unsupported` then names that format ("qwen3_coder", "functionary", "glm45",
// "minimax", "deepseek") when it is known.
ToolCallFormat detect_tool_call_format(std::string_view template_source,
                                       std::string* unsupported = nullptr);

// The control tokens' texts a format's calls are written with: the decode worker shows
// these tokens in the answer's text (they are otherwise hidden) so the parser sees them.
std::vector<std::string> tool_call_control_texts(ToolCallFormat format);

struct ToolCall {
    std::string name;
    std::string arguments;  // a JSON object, compact
    std::string id;         // the id the model wrote (Mistral Small's [CALL_ID]); "" if none
};

class ToolCallParser {
  public:
    // parallel false: the first call only (OpenAI's parallel_tool_calls false); what follows
    // it is dropped.
    explicit ToolCallParser(ToolCallFormat format, bool parallel = true);

    struct Step {
        std::string content;          // text to show now
        std::vector<ToolCall> calls;  // calls complete now, in order
    };
    // The next piece of the answer.
    Step feed(std::string_view piece);
    // The answer ended: what was held back, as calls or as content.
    Step finish();

    int calls_seen() const { return calls_seen_; }

  private:
    void scan(Step& out, bool at_end);
    void scan_hermes(Step& out, bool at_end);
    void scan_until_marker(Step& out, std::string_view marker, bool at_end);
    void take_calls(std::vector<ToolCall> calls, std::string_view raw, Step& out);

    ToolCallFormat format_;
    bool parallel_;
    enum class State { kText, kInCall, kHeld } state_ = State::kText;
    bool at_start_ = true;     // llama3_json: nothing but whitespace seen yet
    bool after_call_ = false;  // hermes: only whitespace since the last </tool_call>
    std::string pending_;      // text not yet given out
    int calls_seen_ = 0;
};

}  // namespace deltaserve::model
