#include "openai_tools.h"

#include <set>

#include "json_body.h"

namespace deltaserve::api {

namespace {

std::string dump(const RequestJson& j) {
    return j.dump(-1, ' ', false, RequestJson::error_handler_t::replace);
}

// OpenAI's rule for a function's name: 1 to 64 of [A-Za-z0-9_-].
bool valid_tool_name(const std::string& name) {
    if (name.empty() || name.size() > kMaxToolNameBytes) return false;
    for (char c : name) {
        const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                        (c >= '0' && c <= '9') || c == '_' || c == '-';
        if (!ok) return false;
    }
    return true;
}

// The "function" object of a tool or a tool call whose "type" is "function" (a call may
// leave its type out, as OpenAI's own examples do).
Result<const RequestJson*> function_of(const RequestJson& j, const std::string& at,
                                       bool type_required) {
    std::string type = type_required ? "" : "function";
    bool given = false;
    DS_RETURN_IF_ERROR(string_field(j, "type", at + ".type", 64, type, given));
    if (type != "function") return bad_field(at + ".type", "must be \"function\"");
    const RequestJson* fn = field_of(j, "function");
    if (fn == nullptr || !fn->is_object()) return bad_field(at + ".function", "must be an object");
    return fn;
}

Status parse_tool(const RequestJson& tool, const std::string& at, std::set<std::string>& names) {
    if (!tool.is_object()) return bad_field(at, "must be an object");
    DS_ASSIGN_OR_RETURN(const RequestJson* fn, function_of(tool, at, /*type_required=*/true));
    std::string name, text;
    bool given = false;
    DS_RETURN_IF_ERROR(
        string_field(*fn, "name", at + ".function.name", kMaxToolNameBytes, name, given));
    if (!valid_tool_name(name)) {
        return bad_field(
            at + ".function.name",
            "must be 1 to " + std::to_string(kMaxToolNameBytes) + " characters of a-z A-Z 0-9 _ -");
    }
    if (!names.insert(name).second)
        return bad_field(at + ".function.name", "names the function '" + name + "' twice");
    DS_RETURN_IF_ERROR(
        string_field(*fn, "description", at + ".function.description", 1 << 20, text, given));
    if (const RequestJson* p = field_of(*fn, "parameters"); p != nullptr && !p->is_object())
        return bad_field(at + ".function.parameters", "must be a JSON Schema object");
    bool strict = false;
    return boolean_field(*fn, "strict", at + ".function.strict", strict);
}

// A tool call's arguments: a JSON object, or a string holding one (as OpenAI sends them).
Result<RequestJson> call_arguments(const RequestJson& args, const std::string& at) {
    if (args.is_object()) return args;
    if (!args.is_string()) return bad_field(at, "must be a string holding a JSON object");
    auto parsed = parse_ordered_json_body(args.get_ref<const std::string&>());
    if (!parsed.ok() || !parsed->is_object())
        return bad_field(
            at, "is not a JSON object (" +
                    (parsed.ok() ? std::string("another JSON value") : parsed.status().message()) +
                    ")");
    return std::move(*parsed);
}

Result<RequestJson> parse_tool_call(const RequestJson& call, const std::string& at) {
    if (!call.is_object()) return bad_field(at, "must be an object");
    std::string id, name;
    bool given = false;
    DS_RETURN_IF_ERROR(string_field(call, "id", at + ".id", kMaxToolCallIdBytes, id, given));
    if (id.empty()) return bad_field(at + ".id", "must be a non-empty string");
    DS_ASSIGN_OR_RETURN(const RequestJson* fn, function_of(call, at, /*type_required=*/false));
    DS_RETURN_IF_ERROR(
        string_field(*fn, "name", at + ".function.name", kMaxToolCallIdBytes, name, given));
    if (name.empty()) return bad_field(at + ".function.name", "must be a non-empty string");
    RequestJson args = RequestJson::object();
    if (const RequestJson* a = field_of(*fn, "arguments")) {
        DS_ASSIGN_OR_RETURN(args, call_arguments(*a, at + ".function.arguments"));
    }
    return RequestJson{{"id", id},
                       {"type", "function"},
                       {"function", {{"name", name}, {"arguments", std::move(args)}}}};
}

}  // namespace

Status parse_tool_fields(const RequestJson& j, ChatRequest& r) {
    const RequestJson* tools = field_of(j, "tools");
    std::set<std::string> names;
    if (tools != nullptr) {
        if (!tools->is_array()) return bad_field("tools", "must be an array");
        if (tools->size() > kMaxTools)
            return bad_field("tools", "holds more than " + std::to_string(kMaxTools) + " tools");
        for (size_t i = 0; i < tools->size(); ++i)
            DS_RETURN_IF_ERROR(parse_tool((*tools)[i], "tools[" + std::to_string(i) + "]", names));
    }
    DS_RETURN_IF_ERROR(
        boolean_field(j, "parallel_tool_calls", "parallel_tool_calls", r.parallel_tool_calls));
    std::string choice = "auto";
    if (const RequestJson* c = field_of(j, "tool_choice")) {
        if (c->is_string()) {
            choice = c->get<std::string>();
            if (choice != "auto" && choice != "none" && choice != "required")
                return bad_field("tool_choice", "must be auto, none, required or a function");
        } else if (c->is_object()) {
            const RequestJson* fn = field_of(*c, "function");
            std::string name;
            bool given = false;
            if (fn == nullptr || !fn->is_object())
                return bad_field("tool_choice.function", "must be an object");
            DS_RETURN_IF_ERROR(string_field(*fn, "name", "tool_choice.function.name",
                                            kMaxToolNameBytes, name, given));
            if (names.count(name) == 0)
                return bad_field("tool_choice.function.name", "names no function of tools");
            choice = "a named function";
            r.forced_tool_name = name;
        } else {
            return bad_field("tool_choice", "must be a string or an object");
        }
    }
    if (choice != "auto" && choice != "none") {
        if (tools == nullptr || tools->empty())
            return bad_field("tool_choice", "needs tools to choose from");
        // Enforced by constrained decoding once the template's call format is known.
        r.force_tool_call = true;
    }
    if (tools != nullptr && !tools->empty() && choice != "none") {
        r.tools_json = dump(*tools);
        r.parse_tool_calls = true;
    }
    return Status();
}

Status parse_message_extras(const RequestJson& m, const std::string& at, bool has_content,
                            model::ChatMessage& out) {
    RequestJson whole = {{"role", out.role},
                         {"content", has_content ? RequestJson(out.content) : RequestJson()}};
    bool extra = false;
    std::string text;
    bool given = false;
    DS_RETURN_IF_ERROR(string_field(m, "name", at + ".name", kMaxToolCallIdBytes, text, given));
    if (given) {
        whole["name"] = text;
        extra = true;
    }
    if (out.role == "tool") {
        DS_RETURN_IF_ERROR(string_field(m, "tool_call_id", at + ".tool_call_id",
                                        kMaxToolCallIdBytes, text, given));
        if (text.empty()) return bad_field(at + ".tool_call_id", "must be a non-empty string");
        whole["tool_call_id"] = text;
        extra = true;
    }
    const RequestJson* calls = field_of(m, "tool_calls");
    if (calls != nullptr) {
        if (out.role != "assistant")
            return bad_field(at + ".tool_calls", "is only for an assistant's message");
        if (!calls->is_array() || calls->size() > kMaxTools)
            return bad_field(at + ".tool_calls",
                             "must be an array of at most " + std::to_string(kMaxTools) + " calls");
        RequestJson list = RequestJson::array();
        for (size_t i = 0; i < calls->size(); ++i) {
            DS_ASSIGN_OR_RETURN(
                RequestJson call,
                parse_tool_call((*calls)[i], at + ".tool_calls[" + std::to_string(i) + "]"));
            list.push_back(std::move(call));
        }
        whole["tool_calls"] = std::move(list);
        extra = true;
    }
    if (out.role == "assistant") {
        DS_RETURN_IF_ERROR(string_field(m, "reasoning_content", at + ".reasoning_content",
                                        size_t{1} << 24, text, given));
        if (given) {
            whole["reasoning_content"] = text;
            extra = true;
        }
    }
    if (extra) out.json = dump(whole);
    return Status();
}

}  // namespace deltaserve::api
