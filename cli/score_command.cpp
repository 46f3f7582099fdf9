// deltaserve score: teacher-forced scoring of a text with a KV policy against full KV.
//
// The text is fed --batch-size tokens at a time to two contexts, one with every token kept
// and one with the chosen policy (which shrinks its cache after each chunk, as it would
// after each prompt chunk in serving). Every token after the first is scored from the
// logits of the token before it: perplexity under each, and the KL divergence from the
// full-KV distribution to the policy's. One JSON object goes to stdout.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "deltaserve/model/scoring.h"
#include "run_options.h"

namespace deltaserve::cli {

namespace {

struct Totals {
    int64_t scored = 0;
    double nll = 0, nll_full = 0, kl = 0;
};

// Scores a chunk whose logits rows are [n][n_vocab]: row t predicts tokens[first + t + 1].
void score_chunk(const std::vector<float>& full, const std::vector<float>& pol, int32_t n_vocab,
                 const std::vector<int32_t>& tokens, size_t first, size_t n, Totals& t) {
    std::vector<double> lf, lp;
    for (size_t i = 0; i < n && first + i + 1 < tokens.size(); ++i) {
        model::log_softmax(full.data() + i * n_vocab, n_vocab, lf);
        model::log_softmax(pol.data() + i * n_vocab, n_vocab, lp);
        const int32_t next = tokens[first + i + 1];
        t.nll_full -= lf[next];
        t.nll -= lp[next];
        t.kl += model::kl_divergence(lf, lp);
        ++t.scored;
    }
}

}  // namespace

int score_main(int argc, char** argv) {
    RunOptions o;
    std::string text_path;
    ArgParser p("deltaserve score",
                "Scores a text teacher-forced with --kv-policy / --kv-keep against full KV and "
                "prints one JSON "
                "object: tokens, ppl, ppl_full, kl_mean, keep_ratio.");
    o.register_flags(p);
    p.add("text", &text_path, "UTF-8 text file to score");
    if (auto exit_code = parse_flags(p, argc, argv)) return *exit_code;
    if (text_path.empty()) {
        print_error(invalid_argument("--text is required"));
        return 2;
    }
    std::ifstream in(text_path, std::ios::binary);
    if (!in) {
        print_error(not_found("cannot open " + text_path));
        return 1;
    }
    std::stringstream buf;
    buf << in.rdbuf();
    const std::string text = buf.str();
    if (int64_t bad = model::find_invalid_utf8(text); bad >= 0) {
        print_error(
            invalid_argument(text_path + " is not valid UTF-8 (byte " + std::to_string(bad) + ")"));
        return 1;
    }
    // The two contexts evaluate in turn: one pool for both, not two competing for the cores.
    o.pool = std::make_shared<ThreadPool>(o.threads > 0 ? o.threads : default_thread_count());
    auto loaded = load_for_run(o);  // the policy context
    if (!loaded) {
        print_error(loaded.error());
        return 1;
    }
    const model::Model& m = *loaded->model;
    model::ContextOptions full_options = o.context();
    full_options.kv = kvstore::EvictionConfig{};
    auto full = model::InferenceContext::create(m, full_options);
    if (!full) {
        print_error(full.error());
        return 1;
    }
    auto tokens = m.tokenizer->encode(text, m.tokenizer->vocab().add_bos, false);
    if (!tokens) {
        print_error(tokens.error());
        return 1;
    }
    if (tokens->size() < 2) {
        print_error(invalid_argument(text_path + " has fewer than 2 tokens: nothing to score"));
        return 1;
    }
    if (static_cast<int64_t>(tokens->size()) > (*full)->n_ctx()) {
        print_error(out_of_range(text_path + " has " + std::to_string(tokens->size()) +
                                 " tokens; the context holds " + std::to_string((*full)->n_ctx()) +
                                 " (raise --ctx-size)"));
        return 1;
    }
    const int32_t n_vocab = m.config.n_vocab;
    Totals t;
    const size_t chunk = static_cast<size_t>(o.batch_size);
    for (size_t first = 0; first < tokens->size(); first += chunk) {
        const size_t n = std::min(chunk, tokens->size() - first);
        const std::span<const int32_t> piece(tokens->data() + first, n);
        auto lf = (*full)->eval_all(piece);
        auto lp = loaded->ctx->eval_all(piece);
        if (!lf || !lp) {
            print_error(!lf ? lf.error() : lp.error());
            return 1;
        }
        score_chunk(*lf, *lp, n_vocab, *tokens, first, n, t);
    }
    nlohmann::json out;
    out["tokens"] = tokens->size();
    out["scored"] = t.scored;
    out["ppl"] = std::exp(t.nll / static_cast<double>(t.scored));
    out["ppl_full"] = std::exp(t.nll_full / static_cast<double>(t.scored));
    out["kl_mean"] = t.kl / static_cast<double>(t.scored);
    out["keep_ratio"] = loaded->ctx->keep_ratio();
    out["kv_bytes"] = loaded->ctx->kv_bytes();
    out["kv_bytes_full_fp16"] = static_cast<size_t>(kvstore::full_fp16_bytes(
        static_cast<int32_t>(tokens->size()), m.config.n_layers, m.config.kv_dim()));
    out["policy"] = o.kv_policy;
    out["keep_target"] = o.kv_keep;
    out["chunk"] = o.batch_size;
    std::printf("%s\n", out.dump().c_str());
    return 0;
}

}  // namespace deltaserve::cli
