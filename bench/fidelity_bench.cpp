// Fidelity benchmark of the KV policies against full KV (bench/README.md), in one process
// so every arm sees the same tokens:
//   ppl        teacher-forced perplexity and mean KL(full || policy) over natural text of
//              each length, fed --chunk tokens at a time (policies compress after each),
//              but the last --decode-tail tokens one at a time, as generation feeds them:
//              those are also reported alone (ppl_tail, kl_tail), since a policy may
//              select or evict differently for single tokens than for chunks;
//   decode     ms per single-token step after that text, at 2k and 8k (median of --decode-steps,
//   16;
//              every step's ms, in order, under decode_step_ms);
//   retrieval  passkey in filler, one of three needles, key-value lookup with random keys:
//              exact match (every answer token the argmax) and the answer's log-likelihood,
//              the answer fed one token at a time after the first, as generation feeds it;
//   multiturn  a shared context with four facts, then one question per turn about a fact
//              no earlier question touched (static eviction loses what it threw away).
// Writes one JSON object (--out); bench/run_fidelity_bench.py prints the table and plot.
//
// Usage: deltaserve-bench-fidelity --model M --profile P --text FILE --out R.json
//        [--lengths 2048,4096,8192] [--keeps 0.5,0.3,0.2] [--policies deltakv,snapkv,...]
//        [--retrieval-keeps 0.3] [--tasks ppl,decode,retrieval,multiturn] [--chunk 256]
//        [--decode-tail 128]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "deltaserve/common/args.h"
#include "deltaserve/common/logging.h"
#include "deltaserve/common/thread_pool.h"
#include "deltaserve/kernels/backend.h"
#include "deltaserve/kvstore/kv_policy.h"
#include "deltaserve/model/inference_context.h"
#include "deltaserve/model/model.h"
#include "deltaserve/model/sampler.h"
#include "deltaserve/model/scoring.h"

namespace {

using namespace deltaserve;
using model::InferenceContext;
using Json = nlohmann::ordered_json;

struct Options {
    std::string model = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    std::string profile =
        "profiles/SmolLM2-135M-Instruct.Q4_1.gguf/deltakv.json";  // trimkv.json beside it
    std::string text, out = "fidelity.json";
    std::string lengths = "2048,4096,8192", keeps = "0.5,0.3,0.2", retrieval_keeps = "0.3";
    std::string policies = "deltakv,kvcompress,d2o,trimkv,snapkv,h2o,keydiff,streaming";
    std::string tasks = "ppl,decode,retrieval,multiturn";
    int32_t chunk = 256, threads = 2, decode_tail = 128, decode_steps = 16;
    int32_t probes = 1;                   // retrieval probes per task and length (means reported)
    std::string device = "cpu";           // --device: the forward pass's backend
    kernels::Backend* backend = nullptr;  // its choice
    bool chunked_answer =
        false;                 // retrieval, multi-turn: the answer in one chunk, not step by step
    float select = 0.1f;       // deltakv: share of compressed tokens per decode step (besides pins)
    int score_every = 0;       // deltakv: scorer layers (0: the paper's observation-layer pick)
    float score_dims = 0.25f;  // deltakv: a scorer's first pass, share of key dimensions
    float pin = 0.1f;     // deltakv: share of the region a chunk pins for the decode steps after it
    int32_t follow = 16;  // deltakv: tokens a decode step read most that the next reads again
    float exact = 0.0f;   // deltakv: share of compressed tokens kept exact, the worst reconstructed
    float exact_depth = 0.5f;  // deltakv: share of the sparse layers (the first) that choose them
};

template <class T>
std::vector<T> list(const std::string& s) {
    std::vector<T> out;
    std::stringstream in(s);
    for (std::string item; std::getline(in, item, ',');) {
        if constexpr (std::is_same_v<T, std::string>) {
            out.push_back(item);
        } else {
            out.push_back(static_cast<T>(std::stod(item)));
        }
    }
    return out;
}

bool has(const std::string& csv, const std::string& item) {
    const auto v = list<std::string>(csv);
    return std::find(v.begin(), v.end(), item) != v.end();
}

struct Arm {
    std::string policy;
    float keep = 1.0f;
    std::unique_ptr<InferenceContext> ctx;
    std::string name() const {
        char b[64];
        std::snprintf(b, sizeof b, "%s@%.2f", policy.c_str(), keep);
        return policy == "full" ? "full" : b;
    }
};

Result<std::vector<Arm>> make_arms(const model::Model& m, const Options& o,
                                   const std::vector<float>& keeps, int32_t n_ctx) {
    std::vector<Arm> arms;
    // One pool for every arm, as one serving process has: each arm with its own would leave
    // the idle arms' workers spinning on the cores the timed arm needs.
    auto pool = std::make_shared<ThreadPool>(o.threads);
    auto add = [&](const std::string& policy, float keep) -> Status {
        model::ContextOptions co;
        co.n_ctx = n_ctx;
        co.n_threads = o.threads;
        co.threads = pool;
        co.n_batch = o.chunk;
        co.kv.policy = policy;
        co.kv.keep = keep;
        co.kv_profile = o.profile;
        co.backend = o.backend;
        co.deltakv_select = o.select;
        co.deltakv_score_every = o.score_every;
        co.deltakv_score_dims = o.score_dims;
        co.deltakv_pin = o.pin;
        co.deltakv_follow = o.follow;
        co.deltakv_exact = o.exact;
        co.deltakv_exact_depth = o.exact_depth;
        // A policy with a profile of its own (trimkv's gates) finds it beside DeltaKV's.
        DS_ASSIGN_OR_RETURN(const kvstore::KvPolicyInfo* info, kvstore::find_kv_policy(policy));
        if (info->kind == kvstore::KvCacheKind::kEvicting && !info->profile_file.empty()) {
            co.kv_profile =
                (std::filesystem::path(o.profile).parent_path() / info->profile_file).string();
        }
        DS_ASSIGN_OR_RETURN(auto ctx, InferenceContext::create(m, co));
        arms.push_back(Arm{policy, keep, std::move(ctx)});
        return Status();
    };
    DS_RETURN_IF_ERROR(add("full", 1.0f));
    for (float keep : keeps) {
        for (const auto& p : list<std::string>(o.policies)) DS_RETURN_IF_ERROR(add(p, keep));
    }
    return arms;
}

// Feeds tokens in chunks to every arm (in lockstep), the last `tail` one at a time,
// accumulating NLL and KL to arm 0, over all tokens and over the tail alone.
Json perplexity(std::vector<Arm>& arms, const std::vector<int32_t>& tokens, int32_t chunk,
                int32_t tail, int32_t n_vocab) {
    const size_t n_arms = arms.size();
    std::vector<double> nll(n_arms, 0.0), kl(n_arms, 0.0), nll_tail(n_arms, 0.0),
        kl_tail(n_arms, 0.0);
    // Per 1024 positions (by the predicted token's position): where in the context a policy loses.
    constexpr size_t kBlock = 1024;
    const size_t n_blocks = (tokens.size() + kBlock - 2) / kBlock;
    std::vector<std::vector<double>> nll_block(n_arms, std::vector<double>(n_blocks, 0.0));
    int64_t scored = 0, scored_tail = 0;
    std::vector<double> lp;
    std::vector<std::vector<double>> lf;  // full KV's log-probabilities for the chunk, once
    for (auto& a : arms) a.ctx->reset();
    const size_t tail_start =
        tokens.size() - std::min(tokens.size() - 1, static_cast<size_t>(std::max(tail, 0)));
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t at = 0, n = 0; at < tokens.size(); at += n) {
        const bool in_tail = at >= tail_start;
        n = in_tail ? 1 : std::min(static_cast<size_t>(chunk), tail_start - at);
        const std::span<const int32_t> piece(tokens.data() + at, n);
        auto full = arms[0].ctx->eval_all(piece);
        if (!full.ok()) return {{"error", full.error().message()}};
        const size_t rows = at + n < tokens.size() ? n : n - 1;  // the last token predicts nothing
        lf.resize(rows);
        for (size_t t = 0; t < rows; ++t) {
            model::log_softmax(full->data() + t * n_vocab, n_vocab, lf[t]);
            nll[0] -= lf[t][tokens[at + t + 1]];
            nll_block[0][(at + t) / kBlock] -= lf[t][tokens[at + t + 1]];
        }
        for (size_t i = 1; i < n_arms; ++i) {
            auto l = arms[i].ctx->eval_all(piece);
            if (!l.ok()) return {{"error", l.error().message()}};
            for (size_t t = 0; t < rows; ++t) {
                model::log_softmax(l->data() + t * n_vocab, n_vocab, lp);
                const double nl = -lp[tokens[at + t + 1]], k = model::kl_divergence(lf[t], lp);
                nll[i] += nl;
                nll_block[i][(at + t) / kBlock] += nl;
                kl[i] += k;
                if (in_tail) {
                    nll_tail[i] += nl;
                    kl_tail[i] += k;
                }
            }
        }
        if (in_tail) {
            for (size_t t = 0; t < rows; ++t) nll_tail[0] -= lf[t][tokens[at + t + 1]];
            scored_tail += static_cast<int64_t>(rows);
        }
        scored += static_cast<int64_t>(rows);
    }
    Json out = Json::object();
    for (size_t i = 0; i < n_arms; ++i) {
        out[arms[i].name()] = {{"ppl", std::exp(nll[i] / scored)},
                               {"kl_mean", kl[i] / scored},
                               {"keep_ratio", arms[i].ctx->keep_ratio()}};
        Json blocks = Json::array();
        for (size_t b = 0; b < n_blocks; ++b) {
            const size_t rows = std::min(kBlock, tokens.size() - 1 - b * kBlock);
            blocks.push_back(std::exp(nll_block[i][b] / static_cast<double>(rows)));
        }
        out[arms[i].name()]["ppl_per_1024"] = blocks;
        if (scored_tail > 0) {
            out[arms[i].name()]["ppl_tail"] = std::exp(nll_tail[i] / scored_tail);
            out[arms[i].name()]["kl_tail"] = kl_tail[i] / scored_tail;
        }
    }
    out["_tokens"] = tokens.size();
    out["_tail_tokens"] = scored_tail;
    out["_seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return out;
}

// Median ms of `steps` greedy single-token steps for each arm, continuing its sequence. The
// arms take turns step by step, so that a noisy machine slows them alike. `each` gets every
// step's ms, in order.
Json decode_times(std::vector<Arm>& arms, int32_t steps, Json& each) {
    Json out = Json::object();
    each = Json::object();
    std::vector<std::vector<double>> ms(arms.size());
    std::vector<int32_t> next(arms.size(), 0);
    std::vector<uint8_t> ok(arms.size(), 1);
    for (size_t a = 0; a < arms.size(); ++a) {
        auto first = arms[a].ctx->eval(std::span<const int32_t>(&next[a], 1));
        ok[a] = first.ok();
        if (ok[a]) next[a] = model::greedy(*first);
    }
    for (int i = 0; i < steps; ++i) {
        for (size_t a = 0; a < arms.size(); ++a) {
            if (!ok[a]) continue;
            const auto t0 = std::chrono::steady_clock::now();
            auto l = arms[a].ctx->eval(std::span<const int32_t>(&next[a], 1));
            ms[a].push_back(
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                    .count());
            ok[a] = l.ok();
            if (ok[a]) next[a] = model::greedy(*l);
        }
    }
    for (size_t a = 0; a < arms.size(); ++a) {
        if (ms[a].empty()) continue;
        each[arms[a].name()] = ms[a];
        std::sort(ms[a].begin(), ms[a].end());
        out[arms[a].name()] = ms[a][ms[a].size() / 2];
    }
    return out;
}

// A prompt (context + question) and the answer whose tokens are scored.
struct Probe {
    std::vector<int32_t> context, question, answer;
};

// After the context (chunked), the question, then the answer teacher-forced: the answer's
// log-likelihood, and whether every answer token was the argmax. The question goes in as one
// chunk, as a user's turn is prefilled; the answer's tokens after the first go in one at a
// time, as generation feeds them (a decode step may attend differently from a chunk), or
// in one chunk with `chunked_answer`.
std::pair<double, bool> score_answer(InferenceContext& ctx, const std::vector<int32_t>& question,
                                     const std::vector<int32_t>& answer, int32_t n_vocab,
                                     bool chunked_answer) {
    auto l = ctx.eval(question);
    if (!l.ok() || answer.empty()) return {NAN, false};
    std::vector<double> lp;
    model::log_softmax(l->data(), n_vocab, lp);
    double ll = lp[answer[0]];
    bool exact = model::greedy(*l) == answer[0];
    auto take = [&](const float* row, int32_t token) {
        model::log_softmax(row, n_vocab, lp);
        ll += lp[token];
        exact = exact && model::greedy(std::span<const float>(row, n_vocab)) == token;
    };
    if (chunked_answer && answer.size() > 1) {
        auto rest = ctx.eval_all(std::span<const int32_t>(answer.data(), answer.size() - 1));
        if (!rest.ok()) return {NAN, false};
        for (size_t i = 1; i < answer.size(); ++i)
            take(rest->data() + (i - 1) * n_vocab, answer[i]);
        return {ll, exact};
    }
    for (size_t i = 1; i < answer.size(); ++i) {
        auto step = ctx.eval(std::span<const int32_t>(&answer[i - 1], 1));
        if (!step.ok()) return {NAN, false};
        take(step->data(), answer[i]);
    }
    return {ll, exact};
}

Status feed(InferenceContext& ctx, const std::vector<int32_t>& tokens) {
    ctx.reset();
    return ctx.eval(tokens).status();
}

class Tasks {
  public:
    Tasks(const model::Model& m, const std::vector<int32_t>& filler) : m_(m), filler_(filler) {}

    std::vector<int32_t> tok(const std::string& s) const {
        return *m_.tokenizer->encode(s, false, false);
    }

    // Filler of n tokens with pieces inserted at fractional depths.
    std::vector<int32_t> haystack(int32_t n,
                                  const std::vector<std::pair<double, std::string>>& needles,
                                  size_t offset) const {
        std::vector<std::vector<int32_t>> ins;
        int32_t extra = 0;
        for (const auto& nd : needles) {
            ins.push_back(tok(nd.second));
            extra += static_cast<int32_t>(ins.back().size());
        }
        std::vector<int32_t> out;
        const int32_t body = std::max<int32_t>(0, n - extra);
        size_t next = 0;
        for (int32_t i = 0; i < body; ++i) {
            while (next < needles.size() && i >= static_cast<int32_t>(needles[next].first * body)) {
                out.insert(out.end(), ins[next].begin(), ins[next].end());
                ++next;
            }
            out.push_back(filler_[(offset + static_cast<size_t>(i)) % filler_.size()]);
        }
        for (; next < needles.size(); ++next)
            out.insert(out.end(), ins[next].begin(), ins[next].end());
        return out;
    }

    Probe passkey(int32_t n, std::mt19937& rng) const {
        const std::string key = std::to_string(10000 + rng() % 90000);
        Probe p;
        p.question = tok("\nWhat is the pass key? The pass key is");
        p.answer = tok(" " + key);
        p.context = haystack(
            n - static_cast<int32_t>(p.question.size() + p.answer.size()),
            {{0.5, " The pass key is " + key + ". Remember it. " + key + " is the pass key. "}},
            rng() % filler_.size());
        return p;
    }

    Probe needles(int32_t n, std::mt19937& rng) const {
        const char* cities[] = {"Lisbon", "Oslo", "Nairobi"};
        std::vector<std::pair<double, std::string>> ins;
        std::vector<std::string> nums;
        for (int i = 0; i < 3; ++i) {
            nums.push_back(std::to_string(100000 + rng() % 900000));
            ins.push_back({0.25 * (i + 1), std::string(" The special magic number for ") +
                                               cities[i] + " is " + nums.back() + ". "});
        }
        const int ask = static_cast<int>(rng() % 3);
        Probe p;
        p.question = tok(std::string("\nWhat is the special magic number for ") + cities[ask] +
                         "? The special magic number for " + cities[ask] + " is");
        p.answer = tok(" " + nums[ask]);
        p.context = haystack(n - static_cast<int32_t>(p.question.size() + p.answer.size()), ins,
                             rng() % filler_.size());
        return p;
    }

    Probe kv_lookup(int32_t n, std::mt19937& rng) const {
        auto hex = [&] {
            std::string s;
            for (int i = 0; i < 8; ++i) s += "0123456789abcdef"[rng() % 16];
            return s;
        };
        std::vector<std::pair<std::string, std::string>> kv;
        std::string body = "{";
        Probe p;
        while (true) {
            kv.push_back({hex(), hex()});
            const std::string more = "\"" + kv.back().first + "\": \"" + kv.back().second + "\", ";
            if (static_cast<int32_t>(tok(body + more).size()) > n - 40) break;
            body += more;
        }
        kv.pop_back();
        body += "}";
        const auto& pick = kv[rng() % kv.size()];
        p.context = tok("JSON data:\n" + body);
        p.question = tok("\nThe value of key \"" + pick.first + "\" is \"");
        p.answer = tok(pick.second + "\"");
        return p;
    }

  private:
    const model::Model& m_;
    const std::vector<int32_t>& filler_;
};

Json retrieval(std::vector<Arm>& arms, const Tasks& t, int32_t n, int32_t n_vocab, int32_t n_probes,
               bool chunked_answer) {
    Json out = Json::object();
    std::mt19937 rng(static_cast<uint32_t>(n));
    // Probe j of every task is drawn before probe j + 1 of any: probe 0 stays the same
    // whatever the count.
    std::vector<std::pair<const char*, Probe>> probes;
    for (int32_t j = 0; j < n_probes; ++j) {
        probes.push_back({"passkey", t.passkey(n, rng)});
        probes.push_back({"needles", t.needles(n, rng)});
        probes.push_back({"kv_lookup", t.kv_lookup(n, rng)});
    }
    struct Sum {
        double ll = 0;
        int exact = 0, n = 0;
        Json each = Json::array();  // every probe's log-likelihood, in order (null: failed)
    };
    std::map<std::string, std::map<std::string, Sum>> sums;  // task -> arm
    for (const auto& [task, p] : probes) {
        for (auto& a : arms) {
            auto& s = sums[task][a.name()];
            const auto [ll, exact] =
                feed(*a.ctx, p.context).ok()
                    ? score_answer(*a.ctx, p.question, p.answer, n_vocab, chunked_answer)
                    : std::pair<double, bool>{NAN, false};
            if (std::isnan(ll)) {  // the arm failed this probe: left out of its means
                s.each.push_back(nullptr);
                continue;
            }
            s.each.push_back(ll);
            s.ll += ll;
            s.exact += exact;
            ++s.n;
        }
    }
    for (const auto& [task, by_arm] : sums) {
        for (const auto& [arm, s] : by_arm) {
            if (s.n == 0) continue;  // failed every probe: no means
            // Means over the probes scored; exact = the share whose every answer token was the
            // argmax.
            out[task][arm] = {{"loglik", s.ll / s.n},
                              {"exact", static_cast<double>(s.exact) / s.n},
                              {"probes", s.n},
                              {"loglik_each", s.each}};
        }
    }
    return out;
}

Json multiturn(std::vector<Arm>& arms, const Tasks& t, int32_t n, int32_t n_vocab,
               bool chunked_answer) {
    const char* names[] = {"Ada", "Boris", "Chiara", "Dmitri"};
    const char* colours[] = {"green", "orange", "violet", "yellow"};
    std::mt19937 rng(99);
    std::vector<std::pair<double, std::string>> ins;
    std::vector<std::string> numbers;
    for (int i = 0; i < 4; ++i) {
        numbers.push_back(std::to_string(10 + rng() % 90));
        ins.push_back({0.2 * (i + 1),
                       std::string(" Note: ") + names[i] + "'s favourite colour is " + colours[i] +
                           " and " + names[i] + "'s lucky number is " + numbers.back() + ". "});
    }
    const auto context = t.haystack(n, ins, 777);
    Json out = Json::object();
    for (auto& a : arms) {
        if (!feed(*a.ctx, context).ok()) continue;
        Json turns = Json::array();
        double later_ll = 0;
        int later_exact = 0;
        for (int turn = 0; turn < 4; ++turn) {
            const int who = (turn * 3 + 1) % 4;  // asks 1, 0, 3, 2: depth order shuffled
            const auto q = t.tok(std::string("\nQuestion: What is ") + names[who] +
                                 "'s lucky number?\nAnswer: " + names[who] + "'s lucky number is");
            const auto ans = t.tok(" " + numbers[who]);
            const auto [ll, exact] = score_answer(*a.ctx, q, ans, n_vocab, chunked_answer);
            // The answer's last token joins the history too, before the next turn.
            if (!a.ctx->eval(std::span<const int32_t>(ans.data() + ans.size() - 1, 1)).ok()) break;
            turns.push_back({{"asks", names[who]}, {"loglik", ll}, {"exact", exact}});
            if (turn > 0) {
                later_ll += ll;
                later_exact += exact;
            }
        }
        out[a.name()] = {
            {"turns", turns}, {"later_loglik_mean", later_ll / 3}, {"later_exact", later_exact}};
    }
    return out;
}

int run(const Options& o) {
    init_logging("warn");
    model::LoadOptions lo;
    lo.show_progress = false;
    auto m = model::load_model(o.model, lo);
    if (!m.ok()) {
        std::fprintf(stderr, "error: %s\n", m.error().message().c_str());
        return 1;
    }
    std::ifstream in(o.text);
    std::stringstream s;
    s << in.rdbuf();
    auto text = (*m)->tokenizer->encode(s.str(), (*m)->tokenizer->vocab().add_bos, false);
    if (!text.ok() || text->size() < 1000) {
        std::fprintf(stderr, "error: --text %s is missing or too short\n", o.text.c_str());
        return 1;
    }
    const int32_t n_vocab = (*m)->config.n_vocab;
    const auto lengths = list<int32_t>(o.lengths);
    const int32_t n_ctx =
        (*std::max_element(lengths.begin(), lengths.end()) + 512 + 255) / 256 * 256;
    Json result = {{"model", o.model},  {"profile", o.profile},
                   {"text", o.text},    {"text_tokens", text->size()},
                   {"chunk", o.chunk},  {"threads", o.threads},
                   {"device", o.device}};
    auto log = [&](const char* what, int32_t n) {
        std::fprintf(stderr, "[fidelity] %s at %d tokens\n", what, n);
    };
    if (has(o.tasks, "ppl") || has(o.tasks, "decode")) {
        auto arms = make_arms(**m, o, list<float>(o.keeps), n_ctx);
        if (!arms.ok()) {
            std::fprintf(stderr, "error: %s\n", arms.error().message().c_str());
            return 1;
        }
        for (int32_t n : lengths) {
            if (n > static_cast<int32_t>(text->size())) continue;
            log("perplexity", n);
            std::vector<int32_t> tokens(text->begin(), text->begin() + n);
            result["ppl"][std::to_string(n)] =
                perplexity(*arms, tokens, o.chunk, o.decode_tail, n_vocab);
            if (has(o.tasks, "decode") && (n == 2048 || n == 8192)) {
                log("decode timing", n);
                result["decode_ms"][std::to_string(n)] = decode_times(
                    *arms, o.decode_steps, result["decode_step_ms"][std::to_string(n)]);
            }
            std::ofstream(o.out) << result.dump(1) << "\n";
        }
    }
    if (has(o.tasks, "retrieval") || has(o.tasks, "multiturn")) {
        auto arms = make_arms(**m, o, list<float>(o.retrieval_keeps), n_ctx);
        if (!arms.ok()) {
            std::fprintf(stderr, "error: %s\n", arms.error().message().c_str());
            return 1;
        }
        Tasks tasks(**m, *text);
        for (int32_t n : lengths) {
            if (!has(o.tasks, "retrieval")) break;
            log("retrieval", n);
            result["retrieval"][std::to_string(n)] =
                retrieval(*arms, tasks, n, n_vocab, o.probes, o.chunked_answer);
            std::ofstream(o.out) << result.dump(1) << "\n";
        }
        if (has(o.tasks, "multiturn")) {
            const int32_t n =
                std::min<int32_t>(4096, *std::max_element(lengths.begin(), lengths.end()));
            log("multi-turn", n);
            result["multiturn"] = multiturn(*arms, tasks, n, n_vocab, o.chunked_answer);
        }
    }
    std::ofstream(o.out) << result.dump(1) << "\n";
    std::fprintf(stderr, "[fidelity] wrote %s\n", o.out.c_str());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    Options o;
    ArgParser p("deltaserve-bench-fidelity",
                "KV policies against full KV: perplexity, KL, retrieval, multi-turn, decode time.");
    p.add("model", &o.model, "GGUF model");
    p.add("profile", &o.profile, "DeltaKV profile (deltakv.json)");
    p.add("text", &o.text, "natural English text (and retrieval filler)");
    p.add("out", &o.out, "JSON results file");
    p.add("lengths", &o.lengths, "context lengths in tokens");
    p.add("keeps", &o.keeps, "keep ratios for perplexity and decode timing");
    p.add("retrieval-keeps", &o.retrieval_keeps, "keep ratios for retrieval and multi-turn");
    p.add("policies", &o.policies, "policies besides full");
    p.add("tasks", &o.tasks, "ppl, decode, retrieval, multiturn");
    p.add("select", &o.select,
          "deltakv: share of the compressed tokens each decode step attends to");
    p.add("score-every", &o.score_every,
          "deltakv: every this many sparse layers a scorer picks that share with its own keys; 0 = "
          "the paper's pick by the observation layer");
    p.add("score-dims", &o.score_dims,
          "deltakv: share of key dimensions a scorer's first pass scores every token with; 1 = "
          "whole keys");
    p.add("pin", &o.pin,
          "deltakv: share of the compressed tokens a chunk pins for the decode steps after it; 0 = "
          "off");
    p.add("follow", &o.follow,
          "deltakv: latent tokens a decode step attended most that the next attends again (and the "
          "3 after each); 0 = off");
    p.add("exact", &o.exact,
          "deltakv: share of the tokens compression takes that stay exact, those their latents "
          "reconstruct worst; 0 = off");
    p.add("exact-depth", &o.exact_depth,
          "deltakv: share of the sparse layers, the first ones, whose reconstruction errors choose "
          "the exact tokens");
    p.add("probes", &o.probes,
          "retrieval: probes per task and length (each its own random answer and filler; means "
          "reported)");
    p.add_switch("chunked-answer", &o.chunked_answer,
                 "retrieval, multi-turn: score the answer in one chunk instead of one token at a "
                 "time as generation does");
    p.add("decode-tail", &o.decode_tail,
          "last tokens of each text fed one at a time (scored apart too)");
    p.add("decode-steps", &o.decode_steps,
          "single-token steps timed per arm (the median is reported)");
    p.add("chunk", &o.chunk, "tokens per forward call (policies compress after each)");
    p.add("threads", &o.threads, "threads");
    p.add("device", &o.device, "where the forward pass runs: cpu or cuda");
    if (auto code = parse_flags(p, argc - 1, argv + 1)) return *code;
    auto backend = kernels::choose_backend(o.device);
    if (!backend) {
        std::fprintf(stderr, "error: %s\n", backend.error().message().c_str());
        return 2;
    }
    o.backend = *backend;
    if (o.probes < 1) {
        std::fprintf(stderr, "error: --probes must be at least 1\n");
        return 2;
    }
    return run(o);
}
