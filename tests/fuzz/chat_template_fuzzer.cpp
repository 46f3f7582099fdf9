// The Jinja engine on hostile templates and conversations: any template text parses or is
// refused with kInvalidArgument; a parsed one renders any conversation, or fails with
// kInvalidArgument (what the template does wrong, or raises) or kResourceExhausted (its
// bounds), never a crash or a hang; every input byte range lies inside the output.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "deltaserve/model/chat_template.h"
#include "deltaserve/model/jinja.h"

using namespace deltaserve;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    FuzzedDataProvider in(data, size);
    const std::string source = in.ConsumeRandomLengthString(4096);
    auto parsed = model::jinja::JinjaTemplate::parse(source);
    if (!parsed.has_value()) {
        if (parsed.error().code() != StatusCode::kInvalidArgument) std::abort();
        return 0;
    }
    model::ChatTemplate tmpl = model::ChatTemplate::from_jinja(source, "<s>", "</s>");
    if (!tmpl.status().ok()) std::abort();
    model::ChatRenderOptions options;
    options.add_generation_prompt = in.ConsumeBool();
    options.now = 1785024000;
    if (in.ConsumeBool())
        options.tools_json = R"([{"type": "function", "function": {"name": "f"}}])";
    std::vector<model::ChatMessage> messages;
    static const char* const kRoles[] = {"system", "user", "assistant", "tool"};
    while (in.remaining_bytes() > 0 && messages.size() < 16) {
        model::ChatMessage m;
        m.role = in.ConsumeBool() ? std::string(kRoles[in.ConsumeIntegralInRange(0, 3)])
                                  : in.ConsumeRandomLengthString(16);
        m.content = in.ConsumeRandomLengthString(256);
        messages.push_back(std::move(m));
    }
    auto out = tmpl.render(messages, options);
    if (!out.has_value()) {
        const StatusCode c = out.error().code();
        if (c != StatusCode::kInvalidArgument && c != StatusCode::kResourceExhausted) std::abort();
        return 0;
    }
    size_t last = 0;
    for (const auto& [b, e] : out->input) {
        if (b < last || e <= b || e > out->text.size()) std::abort();
        last = e;
    }
    return 0;
}
