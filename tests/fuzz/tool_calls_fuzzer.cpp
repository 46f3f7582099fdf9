// The tool-call parser (model answers read for calls): any text, in any split, gives the same
// calls and text as the whole text at once; every call has a name and a JSON object of
// arguments; nothing crashes or is lost (without calls, the text comes out as it went in).
// Input: a byte choosing the format and parallel, a byte choosing the split, the text.
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "deltaserve/model/tool_calls.h"

using namespace deltaserve::model;

namespace {

struct Parsed {
    std::string content;
    std::vector<ToolCall> calls;
};

Parsed run(ToolCallFormat format, bool parallel, std::string_view text, size_t step) {
    ToolCallParser p(format, parallel);
    Parsed out;
    auto add = [&](ToolCallParser::Step s) {
        out.content += s.content;
        for (auto& c : s.calls) out.calls.push_back(std::move(c));
    };
    for (size_t i = 0; i < text.size(); i += step) add(p.feed(text.substr(i, step)));
    add(p.finish());
    return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 2) return 0;
    static const ToolCallFormat kFormats[] = {ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json,
                                              ToolCallFormat::kMistral, ToolCallFormat::kNone};
    const ToolCallFormat format = kFormats[data[0] % 4];
    const bool parallel = (data[0] & 4) == 0;
    const size_t step = 1 + data[1] % 16;
    const std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);
    const Parsed whole = run(format, parallel, text, text.size() + 1);
    const Parsed split = run(format, parallel, text, step);
    if (whole.content != split.content || whole.calls.size() != split.calls.size()) std::abort();
    for (size_t i = 0; i < whole.calls.size(); ++i) {
        const ToolCall& c = whole.calls[i];
        if (c.name != split.calls[i].name || c.arguments != split.calls[i].arguments) std::abort();
        if (c.name.empty()) std::abort();
        const auto args = nlohmann::json::parse(c.arguments, nullptr, false);
        if (!args.is_object()) std::abort();
    }
    if (!parallel && whole.calls.size() > 1) std::abort();
    if (format == ToolCallFormat::kNone && whole.content != text) std::abort();
    if (whole.calls.empty() && whole.content.size() > text.size()) std::abort();
    return 0;
}
