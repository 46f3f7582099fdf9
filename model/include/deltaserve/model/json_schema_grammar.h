// JSON Schema -> Grammar: the grammar of the JSON texts a schema admits, for response_format
// (OpenAI's json_object and json_schema) and, later, the arguments of a forced tool call.
//
// The subset is the one OpenAI's strict mode allows, and a little more:
//   type (one or a list): object, array, string, number, integer, boolean, null
//   properties, required, additionalProperties (false, true, or a schema: an object with
//     no properties and a value schema is a map), items, minItems, maxItems
//   enum, const, anyOf, $ref (to "#", "#/$defs/...", "#/definitions/...", any JSON pointer
//     in the document), $defs / definitions, recursion
//   annotations, which change nothing: title, description, default, examples, $schema,
//     $id, $comment, deprecated, readOnly, writeOnly
// Any other keyword is refused by name (e.g. pattern, format, minimum, oneOf): the output
// must always validate, so nothing is ignored. The texts are generated more narrowly than
// the schema admits, never more widely: properties in the schema's order, no properties the
// schema does not name (beside a map's), numbers of at most 16 integer and 16 fraction
// digits, whitespace of at most one newline and 20 spaces or tabs between tokens.
#pragma once

#include <memory>
#include <string_view>

#include "deltaserve/common/status.h"
#include "deltaserve/model/grammar.h"

namespace deltaserve::model {

struct JsonSchemaLimits {
    size_t max_schema_bytes = size_t{1} << 20;
    int32_t max_depth = 64;         // nesting of the schema document
    int32_t max_items = 1024;       // the largest minItems / maxItems bound
    size_t max_elements = 1 << 20;  // the grammar's size
};

// The grammar of the values `schema` (JSON text) admits, finished. kInvalidArgument naming
// the keyword (and where it is, as a JSON pointer) for what is not supported, or for a
// schema that is not valid JSON or admits no value.
Result<std::shared_ptr<const Grammar>> json_schema_grammar(std::string_view schema,
                                                           const JsonSchemaLimits& limits = {});

// The same value between two literal texts (a forced tool call's markers, e.g. Hermes'
// "<tool_call>\n" and "\n</tool_call>").
Result<std::shared_ptr<const Grammar>> json_schema_grammar(std::string_view schema,
                                                           std::string_view prefix,
                                                           std::string_view suffix,
                                                           const JsonSchemaLimits& limits = {});

}  // namespace deltaserve::model
