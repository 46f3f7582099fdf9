// Runs a parsed Jinja template: jinja2's scoping (a for loop's body and a macro's body are
// scopes of their own, a fresh one per iteration; if and set blocks are not), its loop
// variable and loop controls, macros, and transformers' globals.
#include <cstdio>

#include "deltaserve/model/jinja.h"
#include "jinja_ast.h"
#include "jinja_builtins.h"
#include "jinja_format.h"
#include "jinja_parser.h"

namespace deltaserve::model::jinja {
namespace {

constexpr int kMaxCallDepth = 64;
constexpr int64_t kMaxRange = 1'000'000;

class Renderer {
  public:
    Renderer(const RenderOptions& o) : o_(o), now_(o.now >= 0 ? o.now : std::time(nullptr)) {}

    Result<JinjaText> run(const TemplateAst& ast, const Value& context) {
        frames_.push_back({});
        add_globals();
        if (context.is_dict()) {
            for (const auto& [k, v] : context.entries().entries()) assign(k, v);
        } else if (!context.is_undefined()) {
            return invalid_argument("a template's context must be a dict");
        }
        JinjaText out;
        DS_RETURN_IF_ERROR(exec(ast.body, out));
        return out;
    }

  private:
    struct Frame {
        std::vector<std::pair<std::string, Value>> vars;
        bool barrier = false;
    };
    enum class Flow { kNormal, kBreak, kContinue };

    Status error_at(int line, const Status& s) const {
        if (s.code() != StatusCode::kInvalidArgument) return s;
        if (s.message().rfind("chat template", 0) == 0) return s;
        return invalid_argument("chat template line " + std::to_string(line) + ": " + s.message());
    }

    Status step() {
        if (++steps_ > o_.max_steps) {
            return resource_exhausted("chat template: more than " + std::to_string(o_.max_steps) +
                                      " steps");
        }
        return Status::ok_status();
    }

    Status check_size(size_t bytes) const {
        if (bytes > o_.max_output) {
            return resource_exhausted("chat template: output past " +
                                      std::to_string(o_.max_output) + " bytes");
        }
        return Status::ok_status();
    }

    Value lookup(const std::string& name) const {
        for (size_t i = frames_.size(); i-- > 0;) {
            for (const auto& [k, v] : frames_[i].vars) {
                if (k == name) return v;
            }
            if (frames_[i].barrier) {
                for (const auto& [k, v] : frames_[0].vars) {
                    if (k == name) return v;
                }
                break;
            }
        }
        return Value::undefined(name);
    }

    void assign(const std::string& name, Value v) {
        auto& vars = frames_.back().vars;
        for (auto& [k, old] : vars) {
            if (k == name) {
                old = std::move(v);
                return;
            }
        }
        vars.emplace_back(name, std::move(v));
    }

    Status bind(const std::vector<std::string>& targets, const Value& v) {
        if (targets.size() == 1) {
            assign(targets[0], v);
            return Status::ok_status();
        }
        if (!v.is_list() || v.items().size() != targets.size()) {
            return invalid_argument("cannot unpack " + std::string(v.type_name()) + " into " +
                                    std::to_string(targets.size()) + " names");
        }
        for (size_t i = 0; i < targets.size(); ++i) assign(targets[i], v.items()[i]);
        return Status::ok_status();
    }

    // ---- statements ----

    Status exec(const Body& body, JinjaText& out) {
        for (const StmtPtr& s : body) {
            DS_RETURN_IF_ERROR(exec(*s, out));
            if (flow_ != Flow::kNormal) break;
        }
        return Status::ok_status();
    }

    Status exec(const Stmt& s, JinjaText& out) {
        DS_RETURN_IF_ERROR(step());
        Status st = exec_stmt(s, out);
        if (!st.ok()) return error_at(s.line, st);
        return check_size(out.text.size());
    }

    Status exec_stmt(const Stmt& s, JinjaText& out) {
        switch (s.kind) {
            case StmtKind::kText:
                out.append_literal(s.text);
                return Status::ok_status();
            case StmtKind::kOutput: {
                DS_ASSIGN_OR_RETURN(Value v, eval(*s.expr));
                out.append(to_text(v));
                return Status::ok_status();
            }
            case StmtKind::kIf:
                for (size_t i = 0; i < s.conds.size(); ++i) {
                    DS_ASSIGN_OR_RETURN(Value c, eval(*s.conds[i]));
                    if (c.truthy()) return exec(s.bodies[i], out);
                }
                return exec(s.else_body, out);
            case StmtKind::kFor:
                return exec_for(s, out);
            case StmtKind::kSet:
                return exec_set(s);
            case StmtKind::kSetBlock: {
                JinjaText block;
                DS_RETURN_IF_ERROR(exec(s.body, block));
                assign(s.name, Value::string(std::move(block)));
                return Status::ok_status();
            }
            case StmtKind::kMacro: {
                const Stmt* macro = &s;
                assign(s.name, Value::callable(s.name, [this, macro](CallArgs& a) {
                           return call_macro(*macro, a);
                       }));
                return Status::ok_status();
            }
            case StmtKind::kFilterBlock: {
                JinjaText block;
                DS_RETURN_IF_ERROR(exec(s.body, block));
                frames_.push_back({});
                assign("__block__", Value::string(std::move(block)));
                Result<Value> v = eval(*s.expr);
                frames_.pop_back();
                if (!v.has_value()) return v.error();
                out.append(to_text(*v));
                return Status::ok_status();
            }
            case StmtKind::kBreak:
                flow_ = Flow::kBreak;
                return Status::ok_status();
            case StmtKind::kContinue:
                flow_ = Flow::kContinue;
                return Status::ok_status();
            case StmtKind::kScope:
                return exec(s.body, out);
        }
        return internal_error("chat template: an unknown statement");
    }

    Status exec_set(const Stmt& s) {
        DS_ASSIGN_OR_RETURN(Value v, eval(*s.expr));
        if (!s.attr_of.empty()) {
            const Value ns = lookup(s.attr_of);
            if (ns.kind() != Value::Kind::kNamespace) {
                return invalid_argument("cannot assign attribute on non-namespace object '" +
                                        s.attr_of + "'");
            }
            ns.namespace_entries().set(s.targets[0], std::move(v));
            return Status::ok_status();
        }
        return bind(s.targets, v);
    }

    Value loop_object(const ValueList& items, size_t i) {
        const auto n = static_cast<int64_t>(items.size());
        const auto k = static_cast<int64_t>(i);
        Dict d;
        d.set("index", Value::integer(k + 1));
        d.set("index0", Value::integer(k));
        d.set("revindex", Value::integer(n - k));
        d.set("revindex0", Value::integer(n - k - 1));
        d.set("first", Value::boolean(i == 0));
        d.set("last", Value::boolean(k == n - 1));
        d.set("length", Value::integer(n));
        d.set("depth", Value::integer(1));
        d.set("depth0", Value::integer(0));
        d.set("previtem", i > 0 ? items[i - 1] : Value::undefined("there is no previous item"));
        d.set("nextitem", k + 1 < n ? items[i + 1] : Value::undefined("there is no next item"));
        d.set("cycle", Value::callable("cycle", [k](CallArgs& a) -> Result<Value> {
                  if (a.args.empty()) return invalid_argument("loop.cycle: no items");
                  return a.args[static_cast<size_t>(k) % a.args.size()];
              }));
        return Value::dict(std::move(d));
    }

    Status exec_for(const Stmt& s, JinjaText& out) {
        DS_ASSIGN_OR_RETURN(Value seq, eval(*s.expr));
        DS_ASSIGN_OR_RETURN(ValueList items, iterate(seq));
        if (s.cond) {
            ValueList kept;
            for (const Value& item : items) {
                DS_RETURN_IF_ERROR(step());
                frames_.push_back({});
                Status bound = bind(s.targets, item);
                Result<Value> c = bound.ok() ? eval(*s.cond) : Result<Value>(bound);
                frames_.pop_back();
                if (!c.has_value()) return c.error();
                if (c->truthy()) kept.push_back(item);
            }
            items = std::move(kept);
        }
        if (items.empty()) return exec(s.else_body, out);
        for (size_t i = 0; i < items.size(); ++i) {
            DS_RETURN_IF_ERROR(step());
            frames_.push_back({});
            assign("loop", loop_object(items, i));
            Status st = bind(s.targets, items[i]);
            if (st.ok()) st = exec(s.body, out);
            frames_.pop_back();
            DS_RETURN_IF_ERROR(st);
            if (flow_ == Flow::kBreak) {
                flow_ = Flow::kNormal;
                break;
            }
            flow_ = Flow::kNormal;
        }
        return Status::ok_status();
    }

    Result<Value> call_macro(const Stmt& m, CallArgs& a) {
        if (call_depth_ >= kMaxCallDepth) {
            return resource_exhausted("chat template: macros nested deeper than " +
                                      std::to_string(kMaxCallDepth));
        }
        DS_RETURN_IF_ERROR(step());
        if (a.args.size() > m.params.size()) {
            return invalid_argument("macro '" + m.name + "' takes not more than " +
                                    std::to_string(m.params.size()) + " arguments");
        }
        for (const auto& [k, v] : a.kwargs) {
            bool known = false;
            for (const std::string& p : m.params) known = known || p == k;
            if (!known) {
                return invalid_argument("macro '" + m.name + "' takes no keyword argument '" + k +
                                        "'");
            }
        }
        ++call_depth_;
        frames_.push_back({{}, true});
        const Flow saved = flow_;
        flow_ = Flow::kNormal;
        Status st;
        for (size_t i = 0; i < m.params.size() && st.ok(); ++i) {
            Result<Value> v = a.get(m.params[i], static_cast<int>(i));
            if (!v.has_value()) {
                st = v.error();
                break;
            }
            if (v->is_undefined() && m.defaults[i]) v = eval(*m.defaults[i]);
            if (!v.has_value()) {
                st = v.error();
                break;
            }
            assign(m.params[i], *v);
        }
        JinjaText body;
        if (st.ok()) st = exec(m.body, body);
        frames_.pop_back();
        flow_ = saved;
        --call_depth_;
        DS_RETURN_IF_ERROR(st);
        return Value::string(std::move(body));
    }

    // ---- expressions ----

    Result<CallArgs> call_args(const Expr& e, size_t first) {
        CallArgs a;
        const size_t n_kw = e.kwarg_names.size();
        const size_t n_pos = e.kids.size() - first - n_kw;
        for (size_t i = 0; i < e.kids.size() - first; ++i) {
            DS_ASSIGN_OR_RETURN(Value v, eval(*e.kids[first + i]));
            if (i < n_pos) {
                a.args.push_back(std::move(v));
            } else {
                a.kwargs.emplace_back(e.kwarg_names[i - n_pos], std::move(v));
            }
        }
        return a;
    }

    Result<Value> eval(const Expr& e) {
        Result<Value> v = eval_expr(e);
        if (!v.has_value()) return error_at(e.line, v.error());
        return v;
    }

    Result<Value> eval_expr(const Expr& e) {
        switch (e.kind) {
            case ExprKind::kLiteral:
                return e.value;
            case ExprKind::kName:
                return lookup(e.name);
            case ExprKind::kTuple:
            case ExprKind::kList: {
                ValueList items;
                for (const ExprPtr& k : e.kids) {
                    DS_ASSIGN_OR_RETURN(Value v, eval(*k));
                    items.push_back(std::move(v));
                }
                if (e.kind == ExprKind::kTuple) return Value::tuple(std::move(items));
                return Value::list(std::move(items));
            }
            case ExprKind::kDict: {
                Dict d;
                for (size_t i = 0; i + 1 < e.kids.size(); i += 2) {
                    DS_ASSIGN_OR_RETURN(Value k, eval(*e.kids[i]));
                    if (!k.is_string()) return invalid_argument("dict keys must be strings here");
                    DS_ASSIGN_OR_RETURN(Value v, eval(*e.kids[i + 1]));
                    d.set(k.str(), std::move(v));
                }
                return Value::dict(std::move(d));
            }
            case ExprKind::kGetAttr: {
                DS_ASSIGN_OR_RETURN(Value x, eval(*e.kids[0]));
                return get_attribute(x, e.name);
            }
            case ExprKind::kGetItem: {
                DS_ASSIGN_OR_RETURN(Value x, eval(*e.kids[0]));
                DS_ASSIGN_OR_RETURN(Value k, eval(*e.kids[1]));
                return get_item(x, k);
            }
            case ExprKind::kSlice: {
                DS_ASSIGN_OR_RETURN(Value x, eval(*e.kids[0]));
                Value parts[3];
                for (int i = 0; i < 3; ++i) {
                    if (e.kids[static_cast<size_t>(i) + 1]) {
                        DS_ASSIGN_OR_RETURN(parts[i], eval(*e.kids[static_cast<size_t>(i) + 1]));
                    }
                }
                return get_slice(x, parts[0], parts[1], parts[2]);
            }
            case ExprKind::kCall:
                return eval_call(e);
            case ExprKind::kFilter: {
                DS_ASSIGN_OR_RETURN(Value x, eval(*e.kids[0]));
                DS_ASSIGN_OR_RETURN(CallArgs a, call_args(e, 1));
                DS_ASSIGN_OR_RETURN(Value r, apply_filter(e.name, x, a));
                if (r.is_string()) DS_RETURN_IF_ERROR(check_size(r.str().size()));
                return r;
            }
            case ExprKind::kTest: {
                DS_ASSIGN_OR_RETURN(Value x, eval(*e.kids[0]));
                DS_ASSIGN_OR_RETURN(CallArgs a, call_args(e, 1));
                DS_ASSIGN_OR_RETURN(bool r, apply_test(e.name, x, a));
                return Value::boolean(r != e.negated);
            }
            case ExprKind::kUnary:
                return eval_unary(e);
            case ExprKind::kBinary:
                return eval_binary(e);
            case ExprKind::kCompare:
                return eval_compare(e);
            case ExprKind::kCondition: {
                DS_ASSIGN_OR_RETURN(Value c, eval(*e.kids[1]));
                if (c.truthy()) return eval(*e.kids[0]);
                if (e.kids[2]) return eval(*e.kids[2]);
                return Value::undefined("the condition was false and there is no else");
            }
        }
        return internal_error("chat template: an unknown expression");
    }

    Result<Value> eval_call(const Expr& e) {
        DS_ASSIGN_OR_RETURN(Value f, eval(*e.kids[0]));
        if (f.kind() != Value::Kind::kCallable) {
            if (f.is_undefined()) {
                return invalid_argument(f.undefined_name().empty()
                                            ? std::string("calling an undefined value")
                                            : "'" + f.undefined_name() + "' is undefined");
            }
            return invalid_argument("'" + std::string(f.type_name()) + "' object is not callable");
        }
        DS_RETURN_IF_ERROR(step());
        DS_ASSIGN_OR_RETURN(CallArgs a, call_args(e, 1));
        DS_ASSIGN_OR_RETURN(Value r, f.function()(a));
        if (r.is_string()) DS_RETURN_IF_ERROR(check_size(r.str().size()));
        return r;
    }

    Result<Value> eval_unary(const Expr& e) {
        DS_ASSIGN_OR_RETURN(Value x, eval(*e.kids[0]));
        if (e.name == "not") return Value::boolean(!x.truthy());
        if (x.is_undefined()) {
            return invalid_argument("'" + x.undefined_name() + "' is undefined");
        }
        if (!x.is_number()) {
            return invalid_argument("bad operand type for unary " + e.name + ": '" +
                                    std::string(x.type_name()) + "'");
        }
        if (e.name == "+") return x.is_integer() ? Value::integer(x.as_int()) : x;
        if (x.is_integer()) {
            if (x.as_int() == INT64_MIN) return invalid_argument("integer overflow in unary -");
            return Value::integer(-x.as_int());
        }
        return Value::number(-x.as_double());
    }

    Result<Value> eval_binary(const Expr& e) {
        DS_ASSIGN_OR_RETURN(Value a, eval(*e.kids[0]));
        if (e.name == "and") return a.truthy() ? eval(*e.kids[1]) : a;
        if (e.name == "or") return a.truthy() ? a : eval(*e.kids[1]);
        DS_ASSIGN_OR_RETURN(Value b, eval(*e.kids[1]));
        DS_ASSIGN_OR_RETURN(Value r, arithmetic(e.name, a, b));
        if (r.is_string()) DS_RETURN_IF_ERROR(check_size(r.str().size()));
        if (r.is_list()) DS_RETURN_IF_ERROR(check_size(r.items().size()));
        return r;
    }

    Result<Value> eval_compare(const Expr& e) {
        DS_ASSIGN_OR_RETURN(Value left, eval(*e.kids[0]));
        for (size_t i = 0; i < e.ops.size(); ++i) {
            DS_ASSIGN_OR_RETURN(Value right, eval(*e.kids[i + 1]));
            const std::string& op = e.ops[i];
            bool r = false;
            if (op == "==" || op == "!=") {
                r = equal(left, right) == (op == "==");
            } else if (op == "in" || op == "notin") {
                DS_ASSIGN_OR_RETURN(bool in, contains(right, left));
                r = in == (op == "in");
            } else {
                DS_ASSIGN_OR_RETURN(int c, compare(left, right));
                r = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
            }
            if (!r) return Value::boolean(false);
            left = std::move(right);
        }
        return Value::boolean(true);
    }

    // ---- globals ----

    void add_globals() {
        assign("range", Value::callable("range", [](CallArgs& a) -> Result<Value> {
                   DS_RETURN_IF_ERROR(a.check("range", 3, {}));
                   for (const Value& v : a.args) {
                       if (!v.is_integer()) return invalid_argument("range takes integers");
                   }
                   if (a.args.empty()) return invalid_argument("range expected 1 argument, got 0");
                   int64_t start = 0, stop = 0, stride = 1;
                   if (a.args.size() == 1) {
                       stop = a.args[0].as_int();
                   } else {
                       start = a.args[0].as_int();
                       stop = a.args[1].as_int();
                       if (a.args.size() == 3) stride = a.args[2].as_int();
                   }
                   if (stride == 0) return invalid_argument("range() arg 3 must not be zero");
                   ValueList out;
                   for (int64_t i = start; stride > 0 ? i < stop : i > stop; i += stride) {
                       if (static_cast<int64_t>(out.size()) >= kMaxRange) {
                           return resource_exhausted("chat template: a range of more than " +
                                                     std::to_string(kMaxRange) + " items");
                       }
                       out.push_back(Value::integer(i));
                       if ((stride > 0 && i > INT64_MAX - stride) ||
                           (stride < 0 && i < INT64_MIN - stride)) {
                           break;
                       }
                   }
                   return Value::list(std::move(out));
               }));
        const auto keywords = [](std::string_view fn, const CallArgs& a) -> Result<Dict> {
            Dict d;
            if (a.args.size() > 1) {
                return invalid_argument(std::string(fn) +
                                        "() takes at most one positional argument");
            }
            if (a.args.size() == 1) {
                if (!a.args[0].is_mapping()) {
                    return invalid_argument(std::string(fn) + "(): the argument must be a dict");
                }
                for (const auto& [k, v] : a.args[0].entries().entries()) d.set(k, v);
            }
            for (const auto& [k, v] : a.kwargs) d.set(k, v);
            return d;
        };
        assign("namespace", Value::callable("namespace", [keywords](CallArgs& a) -> Result<Value> {
                   DS_ASSIGN_OR_RETURN(Dict d, keywords("namespace", a));
                   return Value::make_namespace(std::move(d));
               }));
        assign("dict", Value::callable("dict", [keywords](CallArgs& a) -> Result<Value> {
                   DS_ASSIGN_OR_RETURN(Dict d, keywords("dict", a));
                   return Value::dict(std::move(d));
               }));
        assign("raise_exception",
               Value::callable("raise_exception", [](CallArgs& a) -> Result<Value> {
                   const std::string msg = a.args.empty() ? "" : py_str(a.args[0]);
                   return invalid_argument("chat template: " + msg);
               }));
        const std::time_t now = now_;
        assign(
            "strftime_now", Value::callable("strftime_now", [now](CallArgs& a) -> Result<Value> {
                if (a.args.size() != 1 || !a.args[0].is_string() || a.args[0].str().size() > 256) {
                    return invalid_argument("strftime_now takes one format string");
                }
                std::tm tm{};
                gmtime_r(&now, &tm);
                char buf[1024];
                const size_t n = std::strftime(buf, sizeof buf, a.args[0].str().c_str(), &tm);
                return Value::literal(std::string(buf, n));
            }));
    }

    const RenderOptions& o_;
    std::time_t now_;
    std::vector<Frame> frames_;
    Flow flow_ = Flow::kNormal;
    int64_t steps_ = 0;
    int call_depth_ = 0;
};

}  // namespace

Result<JinjaTemplate> JinjaTemplate::parse(std::string_view source) {
    DS_ASSIGN_OR_RETURN(std::unique_ptr<TemplateAst> ast, parse_template(source));
    return JinjaTemplate(std::shared_ptr<const TemplateAst>(std::move(ast)));
}

Result<JinjaText> JinjaTemplate::render(const Value& context, const RenderOptions& options) const {
    Renderer r(options);
    return r.run(*ast_, context);
}

}  // namespace deltaserve::model::jinja
