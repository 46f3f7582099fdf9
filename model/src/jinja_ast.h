// The parsed Jinja template: expression and statement nodes, as jinja2's parser builds
// them (nodes.py), for the constructs chat templates use.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "deltaserve/model/jinja_value.h"

namespace deltaserve::model::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind {
    kLiteral,    // value
    kName,       // name
    kTuple,      // kids (a tuple is a list here, as jinja2 prints neither differently in templates)
    kList,       // kids
    kDict,       // kids: key, value, key, value ...
    kGetAttr,    // kids[0].name
    kGetItem,    // kids[0][kids[1]]
    kSlice,      // kids[0][kids[1]:kids[2]:kids[3]] (null kids for omitted parts)
    kCall,       // kids[0](kids[1..] positional, then keyword ones named in kwarg_names)
    kFilter,     // kids[0] | name(kids[1..], keywords)
    kTest,       // kids[0] is [not] name(kids[1..], keywords)
    kUnary,      // op: "-", "+", "not"; kids[0]
    kBinary,     // op: + - * / // % ** ~ and or; kids[0], kids[1]
    kCompare,    // kids[0] (ops[i] kids[i + 1])...; ops: == != < <= > >= in notin
    kCondition,  // kids[0] if kids[1] else kids[2] (kids[2] null: undefined)
};

struct Expr {
    ExprKind kind;
    int line = 0;
    Value value;
    std::string name;      // a name, attribute, filter or test; the operator of unary / binary
    bool negated = false;  // kTest: "is not"
    std::vector<ExprPtr> kids;
    std::vector<std::string> kwarg_names;  // kCall / kFilter / kTest: the last kids' names
    std::vector<std::string> ops;          // kCompare
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class StmtKind {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // conds[i] -> bodies[i]; else_body
    kFor,          // targets in expr [if cond]: body; else_body
    kSet,          // targets = expr, or attr_of.name = expr (namespace attribute)
    kSetBlock,     // {% set name %}body{% endset %}
    kMacro,        // name(params = defaults): body
    kFilterBlock,  // {% filter f(args) %}body{% endfilter %}: expr is the filter applied to a
                   // kName "__block__"
    kBreak,
    kContinue,
    kScope,  // a body run as it stands (the generation block of transformers)
};

struct Stmt {
    StmtKind kind;
    int line = 0;
    std::string text;
    ExprPtr expr;
    ExprPtr cond;
    std::vector<ExprPtr> conds;
    std::vector<Body> bodies;
    Body body;
    Body else_body;
    std::vector<std::string> targets;
    std::string attr_of;  // kSet of "ns.attr": ns (targets[0] is the attribute)
    std::string name;
    std::vector<std::string> params;
    std::vector<ExprPtr> defaults;  // one per param, null when it has none
};

struct TemplateAst {
    Body body;
};

}  // namespace deltaserve::model::jinja
