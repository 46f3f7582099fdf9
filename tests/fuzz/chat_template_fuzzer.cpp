// The chat templates: any Jinja text is recognised or refused (kUnimplemented), and a
// recognised template renders any conversation with every message's content in it.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "deltaserve/model/chat_template.h"

using namespace deltaserve;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    FuzzedDataProvider in(data, size);
    const std::string jinja = in.ConsumeRandomLengthString(4096);
    auto tmpl = model::detect_chat_template(jinja);
    if (!tmpl.ok()) {
        if (tmpl.error().code() != StatusCode::kUnimplemented) std::abort();
        return 0;
    }
    const bool generation_prompt = in.ConsumeBool();
    std::vector<model::ChatMessage> messages;
    static const char* const kRoles[] = {"system", "user", "assistant", "tool"};
    while (in.remaining_bytes() > 0 && messages.size() < 64) {
        model::ChatMessage m;
        m.role = in.ConsumeBool() ? std::string(kRoles[in.ConsumeIntegralInRange(0, 3)])
                                  : in.ConsumeRandomLengthString(32);
        m.content = in.ConsumeRandomLengthString(1024);
        messages.push_back(std::move(m));
    }
    const std::string prompt = model::apply_chat_template(*tmpl, messages, generation_prompt);
    // Llama-3 trims contents: look for the trimmed text.
    for (const auto& m : messages) {
        const size_t b = m.content.find_first_not_of(" \t\n\r\f\v");
        if (b == std::string::npos) continue;
        const size_t e = m.content.find_last_not_of(" \t\n\r\f\v");
        if (prompt.find(std::string_view(m.content).substr(b, e - b + 1)) == std::string::npos) {
            std::abort();
        }
    }
    return 0;
}
