// deltaserve generate: one prompt in, the generated text (and nothing else) on stdout.
#include <cstdio>

#include "commands.h"
#include "generation.h"
#include "run_options.h"

namespace deltaserve::cli {

int generate_main(int argc, char** argv) {
    RunOptions o;
    std::string prompt;
    int32_t max_tokens = 128;
    bool chat = false;
    ArgParser p("deltaserve generate",
                "Generates a continuation of --prompt and prints only the generated text to "
                "stdout (logs go to stderr).");
    o.register_flags(p);
    p.add("prompt", &prompt, "the prompt text (special tokens such as <|im_start|> are parsed)");
    p.add("max-tokens", &max_tokens, "tokens to generate at most; -1 = until the context is full");
    p.add_switch("chat", &chat, "wrap the prompt in the model's chat template as a user message");
    if (auto exit_code = parse_flags(p, argc, argv)) return *exit_code;
    if (!p.given("prompt")) {
        print_error(invalid_argument("--prompt is required (it may be \"\")"));
        return 2;
    }
    if (int64_t bad = model::find_invalid_utf8(prompt); bad >= 0) {
        print_error(
            invalid_argument("the prompt is not valid UTF-8 (byte " + std::to_string(bad) + ")"));
        return 1;
    }
    auto loaded = load_for_run(o);
    if (!loaded) {
        print_error(loaded.error());
        return 1;
    }
    model::InferenceContext& ctx = *loaded->ctx;
    const model::Model& m = *loaded->model;
    const model::Tokenizer& tok = *m.tokenizer;
    // A raw prompt is the operator's own text, control tokens and all (as llama.cpp's CLI);
    // with --chat the template's markers are the only control tokens.
    auto tokens = chat ? model::encode_chat(tok, m.chat_template, {{"user", prompt}}, true)
                       : tok.encode(prompt, tok.vocab().add_bos, true);
    if (!tokens) {
        print_error(tokens.error());
        return 1;
    }
    if (tokens->empty()) {
        print_error(invalid_argument("the prompt is empty and this model adds no BOS token"));
        return 1;
    }
    if (static_cast<int32_t>(tokens->size()) >= ctx.n_ctx()) {
        print_error(out_of_range("the prompt has " + std::to_string(tokens->size()) +
                                 " tokens; the context holds " + std::to_string(ctx.n_ctx()) +
                                 " (raise --ctx-size or shorten the prompt)"));
        return 1;
    }
    model::Sampler sampler(o.sampling(p));
    int32_t prev = tokens->back();
    auto st = generate_tokens(ctx, sampler, *tokens, max_tokens, [&](int32_t id) {
        const std::string piece = tok.token_to_piece(id, prev);
        prev = id;
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
    });
    std::fputc('\n', stdout);
    if (!st) {
        print_error(st.error());
        return 1;
    }
    return 0;
}

}  // namespace deltaserve::cli
