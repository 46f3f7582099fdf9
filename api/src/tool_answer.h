// A turn's answer read for tool calls: its text through model::ToolCallParser in the format
// the chat template teaches, each call given an id as it completes and handed to the
// caller (TurnCallbacks::on_tool_call), the rest handed on as text.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "deltaserve/api/chat_engine.h"
#include "deltaserve/model/chat_template.h"
#include "deltaserve/model/tool_calls.h"

namespace deltaserve::api {

// OK when a request's tools can be served with this template: it renders them and its
// model's call format is parsed here. kInvalidArgument saying why not otherwise.
Status check_tools_servable(const model::ChatTemplate& tmpl);

// The ids of the control tokens the format's calls are written with (tokens the answer's
// text otherwise leaves out, e.g. Llama 3's <|python_tag|>): decode::TurnSpec::shown_tokens.
std::vector<int32_t> tool_call_tokens(const model::Tokenizer& tokenizer,
                                      model::ToolCallFormat format);

// The assistant message a session's history keeps of an answer with calls (content null
// when empty, the calls' arguments as objects, as a client sends it back).
model::ChatMessage assistant_message(const std::string& content,
                                     const std::vector<model::ToolCall>& calls);

class ToolAnswer {
  public:
    // format kNone: every piece goes on as text.
    ToolAnswer(model::ToolCallFormat format, bool parallel, const TurnCallbacks& callbacks);

    // A piece of the answer; false when the caller cancels the turn.
    bool feed(std::string_view piece);
    // The answer ended: what was held back, as calls or text; false when the caller cancels.
    bool finish();

    // The text less the calls ("" for kNone: the turn's own text is the answer).
    const std::string& content() const { return content_; }
    const std::vector<model::ToolCall>& calls() const { return calls_; }

  private:
    bool deliver(model::ToolCallParser::Step step);

    model::ToolCallFormat format_;
    model::ToolCallParser parser_;
    const TurnCallbacks& callbacks_;
    std::string content_;
    std::vector<model::ToolCall> calls_;
};

}  // namespace deltaserve::api
