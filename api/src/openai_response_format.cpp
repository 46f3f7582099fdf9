#include "openai_response_format.h"

#include <string>

#include "deltaserve/model/json_schema_grammar.h"

namespace deltaserve::api {

namespace {

bool schema_name_ok(const std::string& name) {
    if (name.empty() || name.size() > 64) return false;
    for (char c : name) {
        const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                        (c >= '0' && c <= '9') || c == '_' || c == '-';
        if (!ok) return false;
    }
    return true;
}

// A schema given as an object (or, for guided_json, its JSON text).
Result<std::string> schema_text(const RequestJson& s, const std::string& field, bool text_ok) {
    if (s.is_object() || s.is_boolean()) return s.dump();
    if (text_ok && s.is_string()) {
        const RequestJson parsed = RequestJson::parse(s.get<std::string>(), nullptr, false);
        if (parsed.is_discarded()) return bad_field(field, "is not valid JSON");
        return parsed.dump();
    }
    return bad_field(field, "must be a JSON Schema object");
}

Result<std::string> from_response_format(const RequestJson& f) {
    if (!f.is_object()) return bad_field("response_format", "must be an object");
    const RequestJson* type = field_of(f, "type");
    if (type == nullptr || !type->is_string()) {
        return bad_field("response_format.type", "must be text, json_object or json_schema");
    }
    const std::string& t = type->get_ref<const std::string&>();
    if (t == "text") return std::string();
    if (t == "json_object") {
        // llama-server takes a schema here too.
        if (const RequestJson* s = field_of(f, "schema")) {
            return schema_text(*s, "response_format.schema", false);
        }
        return std::string(R"({"type":"object"})");
    }
    if (t != "json_schema") {
        return bad_field("response_format.type", "must be text, json_object or json_schema");
    }
    const RequestJson* js = field_of(f, "json_schema");
    if (js == nullptr || !js->is_object()) {
        return bad_field("response_format.json_schema", "must be an object");
    }
    const RequestJson* name = field_of(*js, "name");
    if (name == nullptr || !name->is_string() || !schema_name_ok(name->get<std::string>())) {
        return bad_field("response_format.json_schema.name",
                         "must be 1 to 64 of a-z, A-Z, 0-9, _ and -");
    }
    bool strict = false;
    DS_RETURN_IF_ERROR(boolean_field(*js, "strict", "response_format.json_schema.strict", strict));
    // No schema: any JSON value (strict or not, the answer is enforced).
    const RequestJson* s = field_of(*js, "schema");
    if (s == nullptr) return std::string("{}");
    return schema_text(*s, "response_format.json_schema.schema", false);
}

}  // namespace

Status parse_response_format(const RequestJson& j, ChatRequest& r) {
    for (const char* field : {"grammar", "guided_regex", "guided_choice", "guided_grammar"}) {
        if (field_of(j, field) != nullptr) {
            return bad_field(field, "is not supported (response_format json_schema is)");
        }
    }
    std::string schema;
    int given = 0;
    if (const RequestJson* f = field_of(j, "response_format")) {
        DS_ASSIGN_OR_RETURN(schema, from_response_format(*f));
        given += schema.empty() ? 0 : 1;
    }
    if (const RequestJson* s = field_of(j, "json_schema")) {
        DS_ASSIGN_OR_RETURN(schema, schema_text(*s, "json_schema", false));
        ++given;
    }
    if (const RequestJson* s = field_of(j, "guided_json")) {
        DS_ASSIGN_OR_RETURN(schema, schema_text(*s, "guided_json", true));
        ++given;
    }
    if (given > 1) {
        return invalid_argument(
            "give one of response_format, json_schema and guided_json, not several");
    }
    return set_response_schema(schema, r);
}

Status set_response_schema(std::string_view schema, ChatRequest& r) {
    if (schema.empty()) return Status();
    DS_RETURN_IF_ERROR(model::json_schema_grammar(schema).status());
    const RequestJson parsed = RequestJson::parse(schema, nullptr, false);
    if (parsed.is_discarded()) return invalid_argument("response schema: not valid JSON");
    r.json_schema = parsed.dump();
    return Status();
}

}  // namespace deltaserve::api
