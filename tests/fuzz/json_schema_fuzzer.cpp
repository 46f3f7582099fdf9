// The response schema compiler and the grammar matcher (schemas come from any client): any
// schema compiles or is refused, without crashing, hanging or growing past the limits; any
// text a compiled grammar admits as whole is valid JSON, and matching it in pieces gives the
// same answer as at once.
// Input: two bytes (big-endian) for the schema's length, the schema, the text.
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "deltaserve/model/grammar_matcher.h"
#include "deltaserve/model/json_schema_grammar.h"

using namespace deltaserve::model;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 2) return 0;
    const size_t n = std::min<size_t>(size - 2, size_t{data[0]} << 8 | data[1]);
    const std::string_view schema(reinterpret_cast<const char*>(data + 2), n);
    const std::string_view text(reinterpret_cast<const char*>(data + 2 + n), size - 2 - n);
    JsonSchemaLimits limits;
    limits.max_elements = 1 << 16;  // keeps each run short
    auto g = json_schema_grammar(schema, limits);
    if (!g.ok()) {
        if (g.status().message().empty()) std::abort();
        return 0;
    }
    GrammarMatcher whole(*g), pieces(*g);
    const bool all = whole.accept(text);
    bool each = true;
    for (size_t i = 0; i < text.size() && each; i += 3) each = pieces.accept(text.substr(i, 3));
    if (all != each) std::abort();
    if (all && whole.can_end() != pieces.can_end()) std::abort();
    if (all && whole.can_end()) {
        if (nlohmann::json::parse(text, nullptr, false).is_discarded()) std::abort();
    }
    return 0;
}
