#include "forced_tool_call.h"

#include "deltaserve/model/json_schema_grammar.h"
#include "json_fields.h"

namespace deltaserve::api {

Result<ForcedCall> forced_tool_call(model::ToolCallFormat format, std::string_view tools_json,
                                    std::string_view name) {
    ForcedCall call;
    const char* arguments = "arguments";
    switch (format) {
        case model::ToolCallFormat::kHermes:
            call.prefix = "<tool_call>\n";
            call.suffix = "\n</tool_call>";
            break;
        case model::ToolCallFormat::kLlama3Json:
            arguments = "parameters";
            break;
        default:
            return bad_field("tool_choice",
                             "'required' or a named function is not supported for the " +
                                 std::string(model::tool_call_format_name(format)) +
                                 " call format (use auto)");
    }
    const RequestJson tools = RequestJson::parse(tools_json, nullptr, false);
    if (!tools.is_array()) return invalid_argument("tool_choice: the tools are not an array");
    RequestJson any = RequestJson::array();
    for (const RequestJson& tool : tools) {
        const RequestJson& fn = tool.at("function");
        const std::string& n = fn.at("name").get_ref<const std::string&>();
        if (!name.empty() && n != name) continue;
        const RequestJson params = fn.contains("parameters") && !fn["parameters"].is_null()
                                       ? fn["parameters"]
                                       : RequestJson{{"type", "object"}};
        any.push_back({{"type", "object"},
                       {"properties", {{"name", {{"const", n}}}, {arguments, params}}},
                       {"required", {"name", arguments}},
                       {"additionalProperties", false}});
    }
    if (any.empty()) return bad_field("tool_choice.function.name", "names no function of tools");
    call.schema = RequestJson{{"anyOf", std::move(any)}}.dump();
    auto g = model::json_schema_grammar(call.schema, call.prefix, call.suffix);
    if (!g.ok()) return bad_field("tool_choice", "cannot be enforced: " + g.status().message());
    return call;
}

}  // namespace deltaserve::api
