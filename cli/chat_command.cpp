// deltaserve chat: an interactive conversation. Each turn only the tokens that are not
// already in the KV cache are evaluated.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "commands.h"
#include "generation.h"
#include "run_options.h"

namespace deltaserve::cli {

namespace {

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
    size_t n = 0;
    while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
    return n;
}

}  // namespace

int chat_main(int argc, char** argv) {
    RunOptions o;
    std::string system;
    int32_t max_tokens = -1;
    ArgParser p("deltaserve chat",
                "Chats with a model: type a message and press enter; /reset starts over, /exit "
                "(or end of input) quits. Replies go to stdout, prompts and logs to stderr.");
    o.register_flags(p);
    p.add("system", &system, "system message (default: the model template's own)");
    p.add("max-tokens", &max_tokens, "tokens per reply at most; -1 = until the model stops");
    if (auto exit_code = parse_flags(p, argc, argv)) return *exit_code;
    auto loaded = load_for_run(o);
    if (!loaded) {
        print_error(loaded.error());
        return 1;
    }
    model::InferenceContext& ctx = *loaded->ctx;
    const model::Model& m = *loaded->model;
    const model::Tokenizer& tok = *m.tokenizer;
    model::Sampler sampler(o.sampling(p));
    const bool interactive = isatty(STDIN_FILENO) == 1;

    std::vector<model::ChatMessage> history;
    if (!system.empty()) history.push_back({"system", system});
    std::vector<int32_t> cached;  // the tokens in the KV cache, in order
    std::string line;
    for (;;) {
        if (interactive) std::fputs("> ", stderr);
        if (!std::getline(std::cin, line) || line == "/exit") break;
        if (line == "/reset") {
            history.resize(system.empty() ? 0 : 1);
            ctx.reset();
            cached.clear();
            continue;
        }
        if (line.empty()) continue;
        if (int64_t bad = model::find_invalid_utf8(line); bad >= 0) {
            print_error(invalid_argument("the message is not valid UTF-8 (byte " +
                                         std::to_string(bad) + ")"));
            continue;
        }
        history.push_back({"user", line});
        auto tokens = model::encode_chat(tok, m.chat_template, history, true);
        if (!tokens) {
            print_error(tokens.error());
            history.pop_back();
            continue;
        }
        if (static_cast<int32_t>(tokens->size()) >= ctx.n_ctx()) {
            print_error(out_of_range("the conversation has " + std::to_string(tokens->size()) +
                                     " tokens, the context holds " + std::to_string(ctx.n_ctx()) +
                                     "; /reset to start over"));
            history.pop_back();
            continue;
        }
        // Reuse the cached prefix; evaluate at least one token to get logits.
        size_t keep = std::min(common_prefix(cached, *tokens), tokens->size() - 1);
        ctx.truncate(static_cast<int32_t>(keep));
        cached.resize(keep);
        std::span<const int32_t> fresh(tokens->data() + keep, tokens->size() - keep);
        int32_t prev = tokens->back();
        std::string reply;
        sampler.reset();
        auto st = generate_tokens(ctx, sampler, fresh, max_tokens, [&](int32_t id) {
            const std::string piece = tok.token_to_piece(id, prev);
            prev = id;
            reply += piece;
            std::fwrite(piece.data(), 1, piece.size(), stdout);
            std::fflush(stdout);
        });
        std::fputc('\n', stdout);
        std::fflush(stdout);
        if (!st) {
            print_error(st.error());
            ctx.truncate(static_cast<int32_t>(keep));
            history.pop_back();
            continue;
        }
        cached = *tokens;
        // A reply cut by --max-tokens ends with a token that was sampled, not evaluated.
        cached.insert(cached.end(), st->generated.begin(), st->generated.end());
        cached.resize(static_cast<size_t>(ctx.n_past()));
        history.push_back({"assistant", reply});
    }
    return 0;
}

}  // namespace deltaserve::cli
