#include "deltaserve/model/tool_calls.h"

#include <nlohmann/json.hpp>

namespace deltaserve::model {

namespace {

using json = nlohmann::ordered_json;

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kMistralCalls = "[TOOL_CALLS]";
constexpr std::string_view kMistralArgs = "[ARGS]";
constexpr std::string_view kMistralCallId = "[CALL_ID]";
constexpr int kMaxDepth = 64;

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string_view trim(std::string_view s) {
    while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
    while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
    return s;
}

// Length of the longest suffix of `text` that is a proper prefix of `marker`.
size_t partial_marker(std::string_view text, std::string_view marker) {
    for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n)
        if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
    return 0;
}

// Where text may be given out up to: before a suffix that may begin `marker`, and before
// trailing whitespace (dropped if a call follows it).
size_t safe_end(std::string_view text, std::string_view marker) {
    size_t end = text.size() - partial_marker(text, marker);
    while (end > 0 && is_space(text[end - 1])) --end;
    return end;
}

// One past the end of the JSON object or array that starts at text[pos], found by its
// brackets outside strings; npos where it is not closed or nests deeper than kMaxDepth.
size_t json_end(std::string_view text, size_t pos) {
    int depth = 0;
    bool in_string = false;
    for (size_t i = pos; i < text.size(); ++i) {
        const char c = text[i];
        if (in_string) {
            if (c == '\\')
                ++i;
            else if (c == '"')
                in_string = false;
            continue;
        }
        if (c == '"') {
            in_string = true;
        } else if (c == '{' || c == '[') {
            if (++depth > kMaxDepth) return std::string_view::npos;
        } else if (c == '}' || c == ']') {
            if (--depth == 0) return i + 1;
        }
    }
    return std::string_view::npos;
}

// The JSON value that is all of `text` (an object or array, nested at most kMaxDepth deep).
std::optional<json> parse_json(std::string_view text) {
    text = trim(text);
    if (text.empty() || (text.front() != '{' && text.front() != '[')) return std::nullopt;
    if (json_end(text, 0) != text.size()) return std::nullopt;
    json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return std::nullopt;
    return j;
}

std::string compact(const json& j) {
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// A call from {"name": ..., "arguments" | "parameters": {...} or "{...}"}.
std::optional<ToolCall> call_from(const json& j) {
    if (!j.is_object()) return std::nullopt;
    auto name = j.find("name");
    if (name == j.end() || !name->is_string() || name->get_ref<const std::string&>().empty())
        return std::nullopt;
    auto args = j.find("arguments");
    if (args == j.end()) args = j.find("parameters");
    ToolCall call;
    call.name = name->get<std::string>();
    if (args == j.end()) {
        call.arguments = "{}";
    } else if (args->is_object()) {
        call.arguments = compact(*args);
    } else if (args->is_string()) {
        auto inner = parse_json(args->get_ref<const std::string&>());
        if (!inner || !inner->is_object()) return std::nullopt;
        call.arguments = compact(*inner);
    } else {
        return std::nullopt;
    }
    auto id = j.find("id");
    if (id != j.end() && id->is_string()) call.id = id->get<std::string>();
    return call;
}

// Llama 3.x: {...} objects separated by ';' or whitespace, after an optional <|python_tag|>.
std::optional<std::vector<ToolCall>> parse_llama3(std::string_view text) {
    text = trim(text);
    if (text.substr(0, kPythonTag.size()) == kPythonTag) text.remove_prefix(kPythonTag.size());
    std::vector<ToolCall> calls;
    size_t pos = 0;
    while (true) {
        while (pos < text.size() && (is_space(text[pos]) || text[pos] == ';')) ++pos;
        if (pos == text.size()) break;
        if (text[pos] != '{') return std::nullopt;
        const size_t end = json_end(text, pos);
        if (end == std::string_view::npos) return std::nullopt;
        auto j = parse_json(text.substr(pos, end - pos));
        if (!j) return std::nullopt;
        auto call = call_from(*j);
        if (!call) return std::nullopt;
        calls.push_back(std::move(*call));
        pos = end;
    }
    if (calls.empty()) return std::nullopt;
    return calls;
}

// Mistral, after [TOOL_CALLS]: a JSON array of calls, or name[CALL_ID]id[ARGS]{...} (the
// [CALL_ID] part optional), each later call after its own [TOOL_CALLS] or directly.
std::optional<std::vector<ToolCall>> parse_mistral(std::string_view text) {
    std::vector<ToolCall> calls;
    while (true) {
        text = trim(text);
        if (text.substr(0, kMistralCalls.size()) == kMistralCalls) {
            text.remove_prefix(kMistralCalls.size());
            text = trim(text);
        }
        if (text.empty()) break;
        if (text.front() == '[') {
            const size_t end = json_end(text, 0);
            if (end == std::string_view::npos) return std::nullopt;
            auto j = parse_json(text.substr(0, end));
            if (!j || !j->is_array() || j->empty()) return std::nullopt;
            for (const json& e : *j) {
                auto call = call_from(e);
                if (!call) return std::nullopt;
                calls.push_back(std::move(*call));
            }
            text.remove_prefix(end);
            continue;
        }
        const size_t args = text.find(kMistralArgs);
        if (args == std::string_view::npos) return std::nullopt;
        ToolCall call;
        std::string_view head = text.substr(0, args);
        if (size_t id = head.find(kMistralCallId); id != std::string_view::npos) {
            call.id = std::string(trim(head.substr(id + kMistralCallId.size())));
            head = head.substr(0, id);
        }
        head = trim(head);
        if (head.empty()) return std::nullopt;
        for (char c : head)
            if (is_space(c) || c == '{' || c == '[' || c == '"') return std::nullopt;
        call.name = std::string(head);
        text.remove_prefix(args + kMistralArgs.size());
        text = trim(text);
        if (text.empty() || text.front() != '{') return std::nullopt;
        const size_t end = json_end(text, 0);
        if (end == std::string_view::npos) return std::nullopt;
        auto j = parse_json(text.substr(0, end));
        if (!j || !j->is_object()) return std::nullopt;
        call.arguments = compact(*j);
        calls.push_back(std::move(call));
        text.remove_prefix(end);
    }
    if (calls.empty()) return std::nullopt;
    return calls;
}

bool contains(std::string_view s, std::string_view what) {
    return s.find(what) != std::string_view::npos;
}

}  // namespace

std::optional<ToolCallFormat> tool_call_format_named(std::string_view name) {
    if (name == "hermes") return ToolCallFormat::kHermes;
    if (name == "llama3_json") return ToolCallFormat::kLlama3Json;
    if (name == "mistral") return ToolCallFormat::kMistral;
    if (name == "none") return ToolCallFormat::kNone;
    return std::nullopt;
}

std::string_view tool_call_format_name(ToolCallFormat format) {
    switch (format) {
        case ToolCallFormat::kHermes:
            return "hermes";
        case ToolCallFormat::kLlama3Json:
            return "llama3_json";
        case ToolCallFormat::kMistral:
            return "mistral";
        case ToolCallFormat::kNone:
            break;
    }
    return "none";
}

ToolCallFormat detect_tool_call_format(std::string_view src, std::string* unsupported) {
    auto refuse = [&](const char* name) {
        if (unsupported) *unsupported = name;
        return ToolCallFormat::kNone;
    };
    if (unsupported) unsupported->clear();
    // Formats that write calls as markup rather than JSON, some inside <tool_call>.
    if (contains(src, "<function=")) {
        return refuse(contains(src, "<parameter=") ? "qwen3_coder" : "functionary");
    }
    if (contains(src, "<arg_key>")) return refuse("glm45");
    if (contains(src, "<invoke name=")) return refuse("minimax");
    if (contains(src, kHermesOpen)) return ToolCallFormat::kHermes;
    if (contains(src, kMistralCalls)) return ToolCallFormat::kMistral;
    if (contains(src, kPythonTag) || (contains(src, "ipython") && contains(src, "\"parameters\"")))
        return ToolCallFormat::kLlama3Json;
    if (contains(src,
                 "tool\xe2\x96\x81"
                 "calls\xe2\x96\x81"
                 "begin"))
        return refuse("deepseek");
    return ToolCallFormat::kNone;
}

std::vector<std::string> tool_call_control_texts(ToolCallFormat format) {
    switch (format) {
        case ToolCallFormat::kHermes:
            return {std::string(kHermesOpen), std::string(kHermesClose)};
        case ToolCallFormat::kLlama3Json:
            return {std::string(kPythonTag)};
        case ToolCallFormat::kMistral:
            return {std::string(kMistralCalls), std::string(kMistralArgs),
                    std::string(kMistralCallId)};
        case ToolCallFormat::kNone:
            break;
    }
    return {};
}

ToolCallParser::ToolCallParser(ToolCallFormat format, bool parallel)
    : format_(format), parallel_(parallel) {}

ToolCallParser::Step ToolCallParser::feed(std::string_view piece) {
    Step out;
    if (format_ == ToolCallFormat::kNone) {
        out.content = std::string(piece);
        return out;
    }
    pending_.append(piece);
    scan(out, /*at_end=*/false);
    return out;
}

ToolCallParser::Step ToolCallParser::finish() {
    Step out;
    if (format_ == ToolCallFormat::kNone) return out;
    scan(out, /*at_end=*/true);
    return out;
}

void ToolCallParser::take_calls(std::vector<ToolCall> calls, std::string_view raw, Step& out) {
    if (calls.empty()) {
        out.content.append(raw);
        return;
    }
    for (ToolCall& call : calls) {
        if (!parallel_ && calls_seen_ > 0) break;
        ++calls_seen_;
        out.calls.push_back(std::move(call));
    }
}

void ToolCallParser::scan(Step& out, bool at_end) {
    switch (format_) {
        case ToolCallFormat::kHermes:
            scan_hermes(out, at_end);
            return;
        case ToolCallFormat::kMistral:
            scan_until_marker(out, kMistralCalls, at_end);
            return;
        case ToolCallFormat::kLlama3Json:
            break;
        case ToolCallFormat::kNone:
            return;
    }
    // Llama 3.x: a call is the whole answer, so only an answer that begins like one is held.
    if (at_start_) {
        const std::string_view text = trim(pending_);
        if (text.empty() && !at_end) return;
        const bool tag_prefix = !text.empty() && text.size() < kPythonTag.size() &&
                                kPythonTag.substr(0, text.size()) == text;
        if (tag_prefix && !at_end) return;
        at_start_ = false;
        state_ = !text.empty() &&
                         (text.front() == '{' || text.substr(0, kPythonTag.size()) == kPythonTag)
                     ? State::kHeld
                     : State::kText;
    }
    if (state_ == State::kText) {
        out.content.append(pending_);
        pending_.clear();
        return;
    }
    if (!at_end) return;
    auto calls = parse_llama3(pending_);
    take_calls(calls ? std::move(*calls) : std::vector<ToolCall>{}, pending_, out);
    pending_.clear();
}

void ToolCallParser::scan_hermes(Step& out, bool at_end) {
    while (true) {
        if (state_ == State::kText && after_call_) {
            // Whitespace after a call, before the next or the end, is not content.
            size_t ws = 0;
            while (ws < pending_.size() && is_space(pending_[ws])) ++ws;
            pending_.erase(0, ws);
            if (pending_.empty() && !at_end) return;
            after_call_ = false;
        }
        const std::string_view text = pending_;
        if (state_ == State::kText) {
            const size_t open = text.find(kHermesOpen);
            if (open == std::string_view::npos) {
                // Trailing whitespace is held back: it is dropped if a call follows.
                const size_t end = at_end ? text.size() : safe_end(text, kHermesOpen);
                out.content.append(text.substr(0, end));
                pending_.erase(0, end);
                if (at_end) pending_.clear();
                return;
            }
            // Text before a call, less the whitespace that separates it from the call.
            size_t end = open;
            while (end > 0 && is_space(text[end - 1])) --end;
            out.content.append(text.substr(0, end));
            pending_.erase(0, open + kHermesOpen.size());
            state_ = State::kInCall;
            continue;
        }
        const size_t close = text.find(kHermesClose);
        if (close == std::string_view::npos && !at_end) return;
        const std::string_view body = text.substr(0, close);
        std::vector<ToolCall> calls;
        if (auto j = parse_json(body))
            if (auto call = call_from(*j)) calls.push_back(std::move(*call));
        if (calls.empty()) {
            out.content.append(kHermesOpen);
            out.content.append(body);
            if (close != std::string_view::npos) out.content.append(kHermesClose);
        } else {
            take_calls(std::move(calls), {}, out);
        }
        if (close == std::string_view::npos) {
            pending_.clear();
            return;
        }
        pending_.erase(0, close + kHermesClose.size());
        after_call_ = true;
        state_ = State::kText;
    }
}

void ToolCallParser::scan_until_marker(Step& out, std::string_view marker, bool at_end) {
    if (state_ == State::kText) {
        const std::string_view text = pending_;
        const size_t at = text.find(marker);
        if (at == std::string_view::npos) {
            const size_t end = at_end ? text.size() : safe_end(text, marker);
            out.content.append(text.substr(0, end));
            pending_.erase(0, end);
            return;
        }
        size_t end = at;
        while (end > 0 && is_space(text[end - 1])) --end;
        out.content.append(text.substr(0, end));
        pending_.erase(0, at);
        state_ = State::kHeld;
    }
    if (!at_end) return;
    auto calls = parse_mistral(pending_);
    take_calls(calls ? std::move(*calls) : std::vector<ToolCall>{}, pending_, out);
    pending_.clear();
}

}  // namespace deltaserve::model
