// llama.cpp's outputs on a set of prompts, as JSON: the reference side of deltaserve's parity
// tests on models it has no other golden for (tests/golden/make_llamacpp_goldens.py runs
// it). Built inside llama.cpp's tree by bench/build_llama_server.sh, against its libllama.
//
//   llama-golden MODEL.gguf PROMPTS OUT.json [gen_tokens [TEXT [text_tokens]]]
//
// PROMPTS: a first line "probes ID ID ...", then per prompt a line "NAME PARSE_SPECIAL NBYTES"
// and NBYTES bytes of text and a newline. For each prompt: llama.cpp's tokens (no BOS added
// unless the model's add_bos_token says so), the top 40 next-token logits, the logits at the
// probe ids, the mean and deviation of the whole row, and `gen_tokens` greedy tokens (argmax,
// no sampler, not stopped at end of generation) with each step's top-2 gap. Settings as
// tests/golden/make_model_golden.py's: n_ctx 1024, n_batch 512, 2 threads, flash attention
// auto, f16 KV; the prompt in one llama_decode, then one per token. With TEXT: the
// perplexity of its first text_tokens (default 1024) tokens (a BOS first where the model's
// add_bos_token says so), every token after the first scored, in one sequence of batches of 512
// (what `deltaserve score` computes), as "ppl".
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "llama.h"

namespace {

struct Prompt {
    std::string name;
    bool parse_special = false;
    std::string text;
};

[[noreturn]] void fail(const std::string& why) {
    std::fprintf(stderr, "llama-golden: %s\n", why.c_str());
    std::exit(1);
}

void read_prompts(const char* path, std::vector<int>& probes, std::vector<Prompt>& prompts) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(std::string("cannot open ") + path);
    std::string line;
    std::getline(in, line);
    std::istringstream head(line);
    std::string word;
    head >> word;
    if (word != "probes") fail("the prompts file does not start with 'probes'");
    for (int id; head >> id;) probes.push_back(id);
    while (std::getline(in, line)) {
        if (line.empty()) continue;
        std::istringstream h(line);
        Prompt p;
        int special = 0;
        size_t n = 0;
        if (!(h >> p.name >> special >> n)) fail("bad prompt header: " + line);
        p.parse_special = special != 0;
        p.text.resize(n);
        if (!in.read(p.text.data(), static_cast<std::streamsize>(n)))
            fail("prompt text ends early");
        prompts.push_back(std::move(p));
    }
}

std::string json_string(const std::string& s) {
    std::string out = "\"";
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += static_cast<char>(c);
        } else if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            out += buf;
        } else {
            out += static_cast<char>(c);
        }
    }
    return out + "\"";
}

std::string num(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", v);
    return buf;
}

std::vector<llama_token> tokenize(const llama_vocab* vocab, const Prompt& p) {
    std::vector<llama_token> ids(p.text.size() + 16);
    int n = llama_tokenize(vocab, p.text.data(), static_cast<int32_t>(p.text.size()), ids.data(),
                           static_cast<int32_t>(ids.size()), /*add_special=*/true, p.parse_special);
    if (n < 0) fail("tokenize failed for " + p.name);
    ids.resize(static_cast<size_t>(n));
    return ids;
}

// exp(mean NLL) of tokens 1..n-1 of ids given those before each, and how many were scored.
double perplexity(llama_context* ctx, const std::vector<llama_token>& ids, int n_vocab) {
    llama_memory_clear(llama_get_memory(ctx), true);
    double nll = 0;
    llama_batch batch = llama_batch_init(512, 0, 1);
    for (size_t start = 0; start < ids.size(); start += 512) {
        const size_t n = std::min<size_t>(512, ids.size() - start);
        batch.n_tokens = static_cast<int32_t>(n);
        for (size_t i = 0; i < n; ++i) {
            batch.token[i] = ids[start + i];
            batch.pos[i] = static_cast<llama_pos>(start + i);
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = 0;
            batch.logits[i] = 1;
        }
        if (llama_decode(ctx, batch) != 0) fail("decode failed on the perplexity text");
        for (size_t i = 0; i < n && start + i + 1 < ids.size(); ++i) {
            const float* l = llama_get_logits_ith(ctx, static_cast<int32_t>(i));
            double mx = l[0];
            for (int v = 1; v < n_vocab; ++v) mx = std::max(mx, static_cast<double>(l[v]));
            double z = 0;
            for (int v = 0; v < n_vocab; ++v) z += std::exp(l[v] - mx);
            nll -= l[ids[start + i + 1]] - mx - std::log(z);
        }
    }
    llama_batch_free(batch);
    return std::exp(nll / static_cast<double>(ids.size() - 1));
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 4) fail("usage: llama-golden MODEL.gguf PROMPTS OUT.json [gen_tokens]");
    const int gen_tokens = argc > 4 ? std::atoi(argv[4]) : 32;
    std::vector<int> probes;
    std::vector<Prompt> prompts;
    read_prompts(argv[2], probes, prompts);

    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    llama_model* model = llama_model_load_from_file(argv[1], mp);
    if (model == nullptr) fail(std::string("cannot load ") + argv[1]);
    const llama_vocab* vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 1024;
    cp.n_batch = 512;
    cp.n_ubatch = 512;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    llama_context* ctx = llama_init_from_model(model, cp);
    if (ctx == nullptr) fail("cannot make a context");

    std::ofstream out(argv[3]);
    out << "{\"system_info\":" << json_string(llama_print_system_info())
        << ",\n\"n_vocab\":" << n_vocab << ",\n\"probe_ids\":[";
    for (size_t i = 0; i < probes.size(); ++i) out << (i ? "," : "") << probes[i];
    out << "],\n\"prompts\":[\n";
    for (size_t pi = 0; pi < prompts.size(); ++pi) {
        const Prompt& p = prompts[pi];
        llama_memory_clear(llama_get_memory(ctx), true);
        std::vector<llama_token> ids = tokenize(vocab, p);
        if (ids.empty() || ids.size() + static_cast<size_t>(gen_tokens) > 1024)
            fail("prompt " + p.name + " is empty or too long");
        if (llama_decode(ctx, llama_batch_get_one(ids.data(), static_cast<int32_t>(ids.size()))) !=
            0)
            fail("decode failed on " + p.name);
        const float* logits = llama_get_logits_ith(ctx, -1);
        std::vector<int> order(static_cast<size_t>(n_vocab));
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(order.begin(), order.begin() + 40, order.end(),
                          [&](int a, int b) { return logits[a] > logits[b]; });
        double sum = 0, sq = 0;
        for (int i = 0; i < n_vocab; ++i) sum += logits[i];
        const double mean = sum / n_vocab;
        for (int i = 0; i < n_vocab; ++i) sq += (logits[i] - mean) * (logits[i] - mean);
        out << (pi ? ",\n" : "") << "{\"name\":" << json_string(p.name)
            << ",\"text\":" << json_string(p.text)
            << ",\"parse_special\":" << (p.parse_special ? "true" : "false") << ",\"tokens\":[";
        for (size_t i = 0; i < ids.size(); ++i) out << (i ? "," : "") << ids[i];
        out << "],\"top_k\":[";
        for (int i = 0; i < 40; ++i)
            out << (i ? "," : "") << "[" << order[static_cast<size_t>(i)] << ","
                << num(logits[order[static_cast<size_t>(i)]]) << "]";
        out << "],\"probe_logits\":[";
        for (size_t i = 0; i < probes.size(); ++i) out << (i ? "," : "") << num(logits[probes[i]]);
        out << "],\"logits_mean\":" << num(mean)
            << ",\"logits_std\":" << num(std::sqrt(sq / n_vocab));
        std::vector<llama_token> greedy;
        std::vector<double> gaps;
        for (int step = 0; step < gen_tokens; ++step) {
            const float* l = llama_get_logits_ith(ctx, -1);
            int best = 0, second = -1;
            for (int i = 1; i < n_vocab; ++i) {
                if (l[i] > l[best]) {
                    second = best;
                    best = i;
                } else if (second < 0 || l[i] > l[second]) {
                    second = i;
                }
            }
            greedy.push_back(best);
            gaps.push_back(static_cast<double>(l[best]) - l[second]);
            llama_token t = best;
            if (step + 1 < gen_tokens && llama_decode(ctx, llama_batch_get_one(&t, 1)) != 0)
                fail("decode failed while generating for " + p.name);
        }
        out << ",\"greedy\":[";
        for (size_t i = 0; i < greedy.size(); ++i) out << (i ? "," : "") << greedy[i];
        out << "],\"greedy_top2_gap\":[";
        for (size_t i = 0; i < gaps.size(); ++i) out << (i ? "," : "") << num(gaps[i]);
        out << "]}";
    }
    out << "\n]";
    if (argc > 5) {
        std::ifstream t(argv[5], std::ios::binary);
        Prompt text{"ppl", false, std::string(std::istreambuf_iterator<char>(t), {})};
        std::vector<llama_token> ids = tokenize(vocab, text);
        const size_t most = argc > 6 ? static_cast<size_t>(std::atoi(argv[6])) : 1024;
        if (ids.size() > most) ids.resize(most);
        if (ids.size() < 2) fail("the perplexity text has under 2 tokens");
        out << ",\n\"ppl\":{\"text_file\":" << json_string(argv[5]) << ",\"tokens\":[";
        for (size_t i = 0; i < ids.size(); ++i) out << (i ? "," : "") << ids[i];
        out << "],\"ppl\":" << num(perplexity(ctx, ids, n_vocab)) << "}";
    }
    out << "}\n";
    llama_free(ctx);
    llama_model_free(model);
    return out.good() ? 0 : 1;
}
