// A recursive-descent parser with jinja2's precedences (parser.py: condexpr, or, and, not,
// compare, math1 (+ -), concat (~), math2 (* / // %), pow, unary, then primaries with their
// postfixes, filters and tests).
#include "jinja_parser.h"

#include <initializer_list>

#include "jinja_lexer.h"

namespace deltaserve::model::jinja {
namespace {

constexpr int kMaxDepth = 200;  // nesting of expressions and blocks

class Parser {
  public:
    explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

    Result<std::unique_ptr<TemplateAst>> run() {
        auto ast = std::make_unique<TemplateAst>();
        DS_ASSIGN_OR_RETURN(ast->body, body({}));
        if (peek().kind != TokenKind::kEnd) {
            return error("unexpected '{% " + t_[pos_ + 1].value + " %}'");
        }
        return ast;
    }

  private:
    const Token& peek(size_t ahead = 0) const { return t_[std::min(pos_ + ahead, t_.size() - 1)]; }
    const Token& next() {
        const Token& t = t_[pos_];
        if (pos_ + 1 < t_.size()) ++pos_;
        return t;
    }
    bool is_op(std::string_view op, size_t ahead = 0) const {
        return peek(ahead).kind == TokenKind::kOperator && peek(ahead).value == op;
    }
    bool is_name(std::string_view n, size_t ahead = 0) const {
        return peek(ahead).kind == TokenKind::kName && peek(ahead).value == n;
    }
    bool accept_op(std::string_view op) {
        if (!is_op(op)) return false;
        next();
        return true;
    }
    bool accept_name(std::string_view n) {
        if (!is_name(n)) return false;
        next();
        return true;
    }
    Status error(const std::string& what) const {
        return invalid_argument("chat template line " + std::to_string(peek().line) + ": " + what);
    }
    Status expect_op(std::string_view op) {
        if (accept_op(op)) return Status::ok_status();
        return error("expected '" + std::string(op) + "'" + found());
    }
    Status expect_kind(TokenKind k, std::string_view what) {
        if (peek().kind == k) {
            next();
            return Status::ok_status();
        }
        return error("expected " + std::string(what) + found());
    }
    std::string found() const {
        const Token& t = peek();
        switch (t.kind) {
            case TokenKind::kEnd:
                return ", found the end of the template";
            case TokenKind::kText:
                return ", found text";
            case TokenKind::kVarEnd:
                return ", found '}}'";
            case TokenKind::kBlockEnd:
                return ", found '%}'";
            default:
                return ", found '" + t.value + "'";
        }
    }
    Result<std::string> expect_name() {
        if (peek().kind != TokenKind::kName) return error("expected a name" + found());
        return next().value;
    }

    // Statements until a block tag named in `ends` (left unconsumed) or the end.
    Result<Body> body(std::initializer_list<std::string_view> ends) {
        if (++depth_ > kMaxDepth) return error("blocks nested too deeply");
        Body out;
        while (true) {
            const Token& t = peek();
            if (t.kind == TokenKind::kEnd) break;
            if (t.kind == TokenKind::kText) {
                auto s = std::make_unique<Stmt>();
                s->kind = StmtKind::kText;
                s->line = t.line;
                s->text = next().value;
                out.push_back(std::move(s));
                continue;
            }
            if (t.kind == TokenKind::kVarBegin) {
                next();
                auto s = std::make_unique<Stmt>();
                s->kind = StmtKind::kOutput;
                s->line = t.line;
                DS_ASSIGN_OR_RETURN(s->expr, expression());
                DS_RETURN_IF_ERROR(expect_kind(TokenKind::kVarEnd, "'}}'"));
                out.push_back(std::move(s));
                continue;
            }
            if (t.kind != TokenKind::kBlockBegin) return error("unexpected token" + found());
            bool is_end = false;
            for (std::string_view e : ends) is_end = is_end || is_name(e, 1);
            if (is_end) break;
            next();
            DS_ASSIGN_OR_RETURN(StmtPtr s, statement());
            if (s) out.push_back(std::move(s));
        }
        --depth_;
        return out;
    }

    Status end_tag(std::string_view name) {
        DS_RETURN_IF_ERROR(
            expect_kind(TokenKind::kBlockBegin, "'{% " + std::string(name) + " %}'"));
        if (!accept_name(name)) return error("expected '" + std::string(name) + "'" + found());
        return expect_kind(TokenKind::kBlockEnd, "'%}'");
    }

    Result<StmtPtr> statement() {
        const int line = peek().line;
        DS_ASSIGN_OR_RETURN(std::string kw, expect_name());
        auto s = std::make_unique<Stmt>();
        s->line = line;
        if (kw == "if") return if_stmt(std::move(s));
        if (kw == "for") return for_stmt(std::move(s));
        if (kw == "set") return set_stmt(std::move(s));
        if (kw == "macro") return macro_stmt(std::move(s));
        if (kw == "filter") return filter_stmt(std::move(s));
        if (kw == "break" || kw == "continue") {
            s->kind = kw == "break" ? StmtKind::kBreak : StmtKind::kContinue;
            if (loops_ == 0) return error("'" + kw + "' outside a loop");
            DS_RETURN_IF_ERROR(expect_kind(TokenKind::kBlockEnd, "'%}'"));
            return s;
        }
        if (kw == "generation") {
            s->kind = StmtKind::kScope;
            DS_RETURN_IF_ERROR(expect_kind(TokenKind::kBlockEnd, "'%}'"));
            DS_ASSIGN_OR_RETURN(s->body, body({"endgeneration"}));
            DS_RETURN_IF_ERROR(end_tag("endgeneration"));
            return s;
        }
        return error("the '" + kw + "' statement is not supported");
    }

    Result<StmtPtr> if_stmt(StmtPtr s) {
        s->kind = StmtKind::kIf;
        while (true) {
            DS_ASSIGN_OR_RETURN(ExprPtr cond, tuple_or_expression());
            DS_RETURN_IF_ERROR(expect_kind(TokenKind::kBlockEnd, "'%}'"));
            DS_ASSIGN_OR_RETURN(Body b, body({"elif", "else", "endif"}));
            s->conds.push_back(std::move(cond));
            s->bodies.push_back(std::move(b));
            DS_RETURN_IF_ERROR(expect_kind(TokenKind::kBlockBegin, "'{% endif %}'"));
            if (accept_name("elif")) continue;
            if (accept_name("else")) {
                DS_RETURN_IF_ERROR(expect_kind(TokenKind::kBlockEnd, "'%}'"));
                DS_ASSIGN_OR_RETURN(s->else_body, body({"endif"}));
                return finish("endif", std::move(s));
            }
            if (!accept_name("endif")) return error("expected 'endif'" + found());
            DS_RETURN_IF_ERROR(expect_kind(TokenKind::kBlockEnd, "'%}'"));
            return s;
        }
    }

    Result<StmtPtr> finish(std::string_view end, StmtPtr s) {
        DS_RETURN_IF_ERROR(end_tag(end));
        return s;
    }

    Result<std::vector<std::string>> targets() {
        std::vector<std::string> out;
        const bool paren = accept_op("(");
        do {
            DS_ASSIGN_OR_RETURN(std::string n, expect_name());
            out.push_back(std::move(n));
        } while (accept_op(","));
        if (paren) DS_RETURN_IF_ERROR(expect_op(")"));
        return out;
    }

    Result<StmtPtr> for_stmt(StmtPtr s) {
        s->kind = StmtKind::kFor;
        DS_ASSIGN_OR_RETURN(s->targets, targets());
        if (!accept_name("in")) return error("expected 'in'" + found());
        DS_ASSIGN_OR_RETURN(s->expr, or_expr());  // no condexpr: "if" filters the loop
        if (accept_name("if")) {
            DS_ASSIGN_OR_RETURN(s->cond, expression());
        }
        if (is_name("recursive")) return error("recursive loops are not supported");
        DS_RETURN_IF_ERROR(expect_kind(TokenKind::kBlockEnd, "'%}'"));
        ++loops_;
        DS_ASSIGN_OR_RETURN(s->body, body({"else", "endfor"}));
        --loops_;
        DS_RETURN_IF_ERROR(expect_kind(TokenKind::kBlockBegin, "'{% endfor %}'"));
        if (accept_name("else")) {
            DS_RETURN_IF_ERROR(expect_kind(TokenKind::kBlockEnd, "'%}'"));
            DS_ASSIGN_OR_RETURN(s->else_body, body({"endfor"}));
            return finish("endfor", std::move(s));
        }
        if (!accept_name("endfor")) return error("expected 'endfor'" + found());
        DS_RETURN_IF_ERROR(expect_kind(TokenKind::kBlockEnd, "'%}'"));
        return s;
    }

    Result<StmtPtr> set_stmt(StmtPtr s) {
        if (peek().kind == TokenKind::kName && is_op(".", 1)) {
            s->kind = StmtKind::kSet;
            s->attr_of = next().value;
            next();
            DS_ASSIGN_OR_RETURN(std::string attr, expect_name());
            s->targets.push_back(std::move(attr));
        } else {
            DS_ASSIGN_OR_RETURN(s->targets, targets());
            if (peek().kind == TokenKind::kBlockEnd || is_op("|")) {
                if (s->targets.size() != 1) return error("a block set takes one name");
                s->kind = StmtKind::kSetBlock;
                s->name = s->targets[0];
                if (accept_op("|")) {
                    return error("a filter on a block set is not supported");
                }
                next();
                DS_ASSIGN_OR_RETURN(s->body, body({"endset"}));
                return finish("endset", std::move(s));
            }
            s->kind = StmtKind::kSet;
        }
        DS_RETURN_IF_ERROR(expect_op("="));
        DS_ASSIGN_OR_RETURN(s->expr, tuple_or_expression());
        DS_RETURN_IF_ERROR(expect_kind(TokenKind::kBlockEnd, "'%}'"));
        return s;
    }

    Result<StmtPtr> macro_stmt(StmtPtr s) {
        s->kind = StmtKind::kMacro;
        DS_ASSIGN_OR_RETURN(s->name, expect_name());
        DS_RETURN_IF_ERROR(expect_op("("));
        while (!is_op(")")) {
            if (!s->params.empty()) DS_RETURN_IF_ERROR(expect_op(","));
            DS_ASSIGN_OR_RETURN(std::string p, expect_name());
            s->params.push_back(std::move(p));
            ExprPtr def;
            if (accept_op("=")) {
                DS_ASSIGN_OR_RETURN(def, expression());
            }
            s->defaults.push_back(std::move(def));
        }
        next();
        DS_RETURN_IF_ERROR(expect_kind(TokenKind::kBlockEnd, "'%}'"));
        const int loops = loops_;
        loops_ = 0;
        DS_ASSIGN_OR_RETURN(s->body, body({"endmacro"}));
        loops_ = loops;
        return finish("endmacro", std::move(s));
    }

    Result<StmtPtr> filter_stmt(StmtPtr s) {
        s->kind = StmtKind::kFilterBlock;
        auto block = std::make_unique<Expr>();
        block->kind = ExprKind::kName;
        block->name = "__block__";
        DS_ASSIGN_OR_RETURN(s->expr, filter(std::move(block)));
        while (accept_op("|")) {
            DS_ASSIGN_OR_RETURN(s->expr, filter(std::move(s->expr)));
        }
        DS_RETURN_IF_ERROR(expect_kind(TokenKind::kBlockEnd, "'%}'"));
        DS_ASSIGN_OR_RETURN(s->body, body({"endfilter"}));
        return finish("endfilter", std::move(s));
    }

    // ---- expressions ----

    ExprPtr node(ExprKind k, int line) {
        auto e = std::make_unique<Expr>();
        e->kind = k;
        e->line = line;
        return e;
    }

    // "a, b" without parentheses where a statement allows it (set, if): a tuple.
    Result<ExprPtr> tuple_or_expression() {
        const int line = peek().line;
        DS_ASSIGN_OR_RETURN(ExprPtr first, expression());
        if (!is_op(",")) return first;
        ExprPtr t = node(ExprKind::kTuple, line);
        t->kids.push_back(std::move(first));
        while (accept_op(",")) {
            if (peek().kind == TokenKind::kBlockEnd) break;
            DS_ASSIGN_OR_RETURN(ExprPtr e, expression());
            t->kids.push_back(std::move(e));
        }
        return t;
    }

    Result<ExprPtr> expression() {
        if (++depth_ > kMaxDepth) return error("expression nested too deeply");
        const int line = peek().line;
        DS_ASSIGN_OR_RETURN(ExprPtr e, or_expr());
        while (accept_name("if")) {
            ExprPtr c = node(ExprKind::kCondition, line);
            DS_ASSIGN_OR_RETURN(ExprPtr cond, or_expr());
            ExprPtr otherwise;
            if (accept_name("else")) {
                DS_ASSIGN_OR_RETURN(otherwise, expression());
            }
            c->kids.push_back(std::move(e));
            c->kids.push_back(std::move(cond));
            c->kids.push_back(std::move(otherwise));
            e = std::move(c);
        }
        --depth_;
        return e;
    }

    Result<ExprPtr> binary_chain(Result<ExprPtr> (Parser::*operand)(),
                                 std::initializer_list<std::string_view> ops, bool names) {
        DS_ASSIGN_OR_RETURN(ExprPtr left, (this->*operand)());
        while (true) {
            std::string op;
            for (std::string_view o : ops) {
                if (names ? is_name(o) : is_op(o)) op = o;
            }
            if (op.empty()) return left;
            const int line = next().line;
            DS_ASSIGN_OR_RETURN(ExprPtr right, (this->*operand)());
            ExprPtr b = node(ExprKind::kBinary, line);
            b->name = op;
            b->kids.push_back(std::move(left));
            b->kids.push_back(std::move(right));
            left = std::move(b);
        }
    }

    Result<ExprPtr> or_expr() { return binary_chain(&Parser::and_expr, {"or"}, true); }
    Result<ExprPtr> and_expr() { return binary_chain(&Parser::not_expr, {"and"}, true); }

    Result<ExprPtr> not_expr() {
        if (is_name("not")) {
            const int line = next().line;
            DS_ASSIGN_OR_RETURN(ExprPtr operand, not_expr());
            ExprPtr u = node(ExprKind::kUnary, line);
            u->name = "not";
            u->kids.push_back(std::move(operand));
            return u;
        }
        return compare();
    }

    Result<ExprPtr> compare() {
        const int line = peek().line;
        DS_ASSIGN_OR_RETURN(ExprPtr first, math1());
        ExprPtr c;
        while (true) {
            std::string op;
            if (is_op("==") || is_op("!=") || is_op("<") || is_op("<=") || is_op(">") ||
                is_op(">=")) {
                op = next().value;
            } else if (is_name("in")) {
                next();
                op = "in";
            } else if (is_name("not") && is_name("in", 1)) {
                next();
                next();
                op = "notin";
            } else {
                break;
            }
            if (!c) {
                c = node(ExprKind::kCompare, line);
                c->kids.push_back(std::move(first));
            }
            DS_ASSIGN_OR_RETURN(ExprPtr rhs, math1());
            c->ops.push_back(op);
            c->kids.push_back(std::move(rhs));
        }
        return c ? std::move(c) : std::move(first);
    }

    Result<ExprPtr> math1() { return binary_chain(&Parser::concat, {"+", "-"}, false); }
    Result<ExprPtr> concat() { return binary_chain(&Parser::math2, {"~"}, false); }
    Result<ExprPtr> math2() { return binary_chain(&Parser::pow, {"*", "/", "//", "%"}, false); }
    Result<ExprPtr> pow() { return binary_chain(&Parser::unary_filtered, {"**"}, false); }

    Result<ExprPtr> unary_filtered() { return unary(true); }

    Result<ExprPtr> unary(bool with_filter) {
        if (++depth_ > kMaxDepth) return error("expression nested too deeply");
        ExprPtr e;
        if (is_op("-") || is_op("+")) {
            const Token& t = next();
            ExprPtr u = node(ExprKind::kUnary, t.line);
            u->name = t.value;
            DS_ASSIGN_OR_RETURN(ExprPtr operand, unary(false));
            u->kids.push_back(std::move(operand));
            e = std::move(u);
        } else {
            DS_ASSIGN_OR_RETURN(e, primary());
            DS_ASSIGN_OR_RETURN(e, postfix(std::move(e)));
        }
        if (with_filter) {
            DS_ASSIGN_OR_RETURN(e, filters_and_tests(std::move(e)));
        }
        --depth_;
        return e;
    }

    Result<ExprPtr> primary() {
        const Token& t = peek();
        switch (t.kind) {
            case TokenKind::kName: {
                next();
                ExprPtr e = node(ExprKind::kLiteral, t.line);
                if (t.value == "true" || t.value == "True") {
                    e->value = Value::boolean(true);
                } else if (t.value == "false" || t.value == "False") {
                    e->value = Value::boolean(false);
                } else if (t.value == "none" || t.value == "None") {
                    e->value = Value::none();
                } else {
                    e->kind = ExprKind::kName;
                    e->name = t.value;
                }
                return e;
            }
            case TokenKind::kString: {
                std::string s = next().value;
                while (peek().kind == TokenKind::kString) s += next().value;  // "a" "b"
                ExprPtr e = node(ExprKind::kLiteral, t.line);
                e->value = Value::literal(std::move(s));
                return e;
            }
            case TokenKind::kInt: {
                ExprPtr e = node(ExprKind::kLiteral, t.line);
                e->value = Value::integer(next().int_value);
                return e;
            }
            case TokenKind::kFloat: {
                ExprPtr e = node(ExprKind::kLiteral, t.line);
                e->value = Value::number(next().float_value);
                return e;
            }
            case TokenKind::kOperator:
                if (t.value == "(") return parenthesized();
                if (t.value == "[") return list_literal();
                if (t.value == "{") return dict_literal();
                break;
            default:
                break;
        }
        return error("expected an expression" + found());
    }

    Result<ExprPtr> parenthesized() {
        const int line = next().line;
        if (accept_op(")")) return node(ExprKind::kTuple, line);
        DS_ASSIGN_OR_RETURN(ExprPtr first, expression());
        if (accept_op(")")) return first;
        ExprPtr t = node(ExprKind::kTuple, line);
        t->kids.push_back(std::move(first));
        while (accept_op(",")) {
            if (is_op(")")) break;
            DS_ASSIGN_OR_RETURN(ExprPtr e, expression());
            t->kids.push_back(std::move(e));
        }
        DS_RETURN_IF_ERROR(expect_op(")"));
        return t;
    }

    Result<ExprPtr> list_literal() {
        ExprPtr l = node(ExprKind::kList, next().line);
        while (!is_op("]")) {
            if (!l->kids.empty()) {
                DS_RETURN_IF_ERROR(expect_op(","));
                if (is_op("]")) break;
            }
            DS_ASSIGN_OR_RETURN(ExprPtr e, expression());
            l->kids.push_back(std::move(e));
        }
        next();
        return l;
    }

    Result<ExprPtr> dict_literal() {
        ExprPtr d = node(ExprKind::kDict, next().line);
        while (!is_op("}")) {
            if (!d->kids.empty()) {
                DS_RETURN_IF_ERROR(expect_op(","));
                if (is_op("}")) break;
            }
            DS_ASSIGN_OR_RETURN(ExprPtr k, expression());
            DS_RETURN_IF_ERROR(expect_op(":"));
            DS_ASSIGN_OR_RETURN(ExprPtr v, expression());
            d->kids.push_back(std::move(k));
            d->kids.push_back(std::move(v));
        }
        next();
        return d;
    }

    Result<ExprPtr> postfix(ExprPtr e) {
        while (true) {
            if (is_op(".")) {
                const int line = next().line;
                if (peek().kind == TokenKind::kInt) {
                    ExprPtr g = node(ExprKind::kGetItem, line);
                    ExprPtr idx = node(ExprKind::kLiteral, line);
                    idx->value = Value::integer(next().int_value);
                    g->kids.push_back(std::move(e));
                    g->kids.push_back(std::move(idx));
                    e = std::move(g);
                    continue;
                }
                ExprPtr g = node(ExprKind::kGetAttr, line);
                DS_ASSIGN_OR_RETURN(g->name, expect_name());
                g->kids.push_back(std::move(e));
                e = std::move(g);
            } else if (is_op("[")) {
                DS_ASSIGN_OR_RETURN(e, subscript(std::move(e)));
            } else if (is_op("(")) {
                ExprPtr c = node(ExprKind::kCall, peek().line);
                c->kids.push_back(std::move(e));
                DS_RETURN_IF_ERROR(call_args(*c));
                e = std::move(c);
            } else {
                return e;
            }
        }
    }

    Result<ExprPtr> subscript(ExprPtr e) {
        const int line = next().line;
        ExprPtr parts[3];
        int n = 0;
        bool slice = false;
        while (true) {
            if (is_op(":")) {
                next();
                slice = true;
                if (++n > 2) return error("a slice takes at most three parts");
                continue;
            }
            if (is_op("]")) break;
            if (parts[n]) return error("expected ':' or ']'" + found());
            DS_ASSIGN_OR_RETURN(parts[n], expression());
        }
        next();
        ExprPtr g = node(slice ? ExprKind::kSlice : ExprKind::kGetItem, line);
        g->kids.push_back(std::move(e));
        if (!slice && !parts[0]) return error("an empty subscript");
        g->kids.push_back(std::move(parts[0]));
        if (slice) {
            g->kids.push_back(std::move(parts[1]));
            g->kids.push_back(std::move(parts[2]));
        }
        return g;
    }

    // "(" args ")" into e.kids (after those already there) and e.kwarg_names.
    Status call_args(Expr& e) {
        DS_RETURN_IF_ERROR(expect_op("("));
        bool first = true;
        while (!is_op(")")) {
            if (!first) {
                DS_RETURN_IF_ERROR(expect_op(","));
                if (is_op(")")) break;
            }
            first = false;
            if (is_op("*") || is_op("**")) return error("*args and **kwargs are not supported");
            if (peek().kind == TokenKind::kName && is_op("=", 1)) {
                e.kwarg_names.push_back(next().value);
                next();
            } else if (!e.kwarg_names.empty()) {
                return error("a positional argument after a keyword argument");
            }
            DS_ASSIGN_OR_RETURN(ExprPtr a, expression());
            e.kids.push_back(std::move(a));
        }
        next();
        return Status::ok_status();
    }

    Result<ExprPtr> filter(ExprPtr operand) {
        ExprPtr f = node(ExprKind::kFilter, peek().line);
        DS_ASSIGN_OR_RETURN(f->name, expect_name());
        while (accept_op(".")) {
            DS_ASSIGN_OR_RETURN(std::string part, expect_name());
            f->name += "." + part;
        }
        f->kids.push_back(std::move(operand));
        if (is_op("(")) DS_RETURN_IF_ERROR(call_args(*f));
        return f;
    }

    Result<ExprPtr> filters_and_tests(ExprPtr e) {
        while (true) {
            if (accept_op("|")) {
                DS_ASSIGN_OR_RETURN(e, filter(std::move(e)));
            } else if (is_name("is")) {
                ExprPtr t = node(ExprKind::kTest, next().line);
                t->negated = accept_name("not");
                DS_ASSIGN_OR_RETURN(t->name, expect_name());
                while (accept_op(".")) {
                    DS_ASSIGN_OR_RETURN(std::string part, expect_name());
                    t->name += "." + part;
                }
                t->kids.push_back(std::move(e));
                if (is_op("(")) {
                    DS_RETURN_IF_ERROR(call_args(*t));
                } else if (test_argument_follows()) {
                    // jinja2: "is divisibleby 3", "is sameas false": one argument, no
                    // parentheses.
                    DS_ASSIGN_OR_RETURN(ExprPtr a, primary());
                    DS_ASSIGN_OR_RETURN(a, postfix(std::move(a)));
                    t->kids.push_back(std::move(a));
                }
                e = std::move(t);
            } else if (is_op("(")) {
                ExprPtr c = node(ExprKind::kCall, peek().line);
                c->kids.push_back(std::move(e));
                DS_RETURN_IF_ERROR(call_args(*c));
                e = std::move(c);
            } else {
                return e;
            }
        }
    }

    bool test_argument_follows() const {
        const Token& t = peek();
        if (t.kind == TokenKind::kName) {
            return t.value != "else" && t.value != "or" && t.value != "and" && t.value != "if" &&
                   t.value != "is" && t.value != "in" && t.value != "not";
        }
        if (t.kind == TokenKind::kString || t.kind == TokenKind::kInt ||
            t.kind == TokenKind::kFloat) {
            return true;
        }
        return is_op("[") || is_op("{");
    }

    std::vector<Token> t_;
    size_t pos_ = 0;
    int depth_ = 0;
    int loops_ = 0;
};

}  // namespace

Result<std::unique_ptr<TemplateAst>> parse_template(std::string_view source) {
    DS_ASSIGN_OR_RETURN(std::vector<Token> tokens, tokenize(source));
    return Parser(std::move(tokens)).run();
}

}  // namespace deltaserve::model::jinja
