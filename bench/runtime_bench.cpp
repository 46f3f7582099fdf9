// deltaserve side of the runtime benchmark: load time, peak RSS, prefill and decode tokens/s.
//
// The methodology is that of bench/llamacpp_runtime.py, so bench/run_runtime_bench.py can put
// the two side by side:
//   - token ids: random in [256, n_vocab), drawn from Python's random.Random(1234) (the same
//     Mersenne Twister seeding and randrange, so both engines see the very same ids), one
//     stream in the same order: warm-up, then each context length in ascending order;
//   - warm-up: a 512-token prefill and 4 single-token decodes;
//   - for each length L in prefill-lens U decode-ctx (ascending): reset, prefill L tokens
//     (timed when L is a prefill length), then --decode-tokens single-token evals (timed
//     when L is a decode depth), each producing logits;
//   - n_ctx = the longest run rounded up to 256;
//   - load_s: load_model + InferenceContext::create, the best of the first load and
//     max(reps, 2) fresh loads after the runs;
//   - peak_rss_mb: getrusage(RUSAGE_SELF).ru_maxrss at the end.
// Prefill is one eval() of the whole prompt (chunked by n_batch inside), decode one eval() of
// one token; only eval() is inside the timed regions.
//
// Usage: deltaserve-bench-runtime --model M.gguf [--threads 2] [--json]
//        [--prefill-lens 512,2048,8000] [--decode-ctx 128,2048,8000] [--decode-tokens 64]
//        [--n-batch 512] [--reps 1] [--decode-batch 1,8,32 --batch-ctx 200] [--no-repack]
// --decode-batch B,...: also B sequences of --batch-ctx tokens each decoding together
// (model::eval_batch, one thread pool, as the decode worker runs them): B x --decode-tokens
// tokens / seconds, after 2 untimed steps; their KV policy --batch-kv-policy (with
// --batch-kv-keep and --batch-kv-profile), full KV by default.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "deltaserve/common/status.h"
#include "deltaserve/common/thread_pool.h"
#include "deltaserve/kernels/backend.h"
#include "deltaserve/model/inference_context.h"
#include "deltaserve/model/model.h"

namespace {

using deltaserve::Result;
using deltaserve::Status;
using deltaserve::model::InferenceContext;
using deltaserve::model::Model;
using Json = nlohmann::ordered_json;

constexpr int32_t kWarmupTokens = 512;
constexpr int32_t kWarmupDecodes = 4;
constexpr int32_t kFirstTokenId = 256;  // below: special/control ids in most vocabularies
constexpr uint32_t kSeed = 1234;

struct BenchOptions {
    std::string model = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    int threads = 2;    // Default: 2.
    bool json = false;  // Default: a table instead of JSON.
    std::vector<int32_t> prefill_lens{512, 2048, 8000};
    std::vector<int32_t> decode_ctx{128, 2048, 8000};
    int32_t decode_tokens = 64;         // timed decode steps per depth
    int32_t n_batch = 512;              // prompt tokens per forward call
    int reps = 1;                       // repeat each measurement, keep the best
    std::vector<int32_t> decode_batch;  // batch sizes for eval_batch; none by default
    int32_t batch_ctx = 200;            // context of each batched sequence
    // The batched sequences' KV policy (--batch-kv-policy; the single-stream runs stay full KV,
    // as llama.cpp's): what a node's sessions decode at together with DeltaKV.
    std::string batch_kv_policy = "full";
    float batch_kv_keep = 1.0f;
    std::string batch_kv_profile;
    bool repack = true;  // --no-repack: the file's row-major layout
    std::string device;  // --device cpu|cuda; "" = cuda when present (kernels::choose_backend)
    deltaserve::kernels::Backend* backend = nullptr;  // its choice, made by main()
};

// Python's random.Random(seed) for a small int seed: MT19937 seeded by init_by_array({seed}),
// randrange(lo, hi) by rejection sampling on getrandbits(bit_length(hi - lo)).
class PyRandom {
  public:
    explicit PyRandom(uint32_t seed) { init_by_array(seed); }

    int32_t randrange(int32_t lo, int32_t hi) {
        const auto n = static_cast<uint32_t>(hi - lo);
        int k = 0;
        while (k < 32 && (n >> k) != 0) ++k;
        uint32_t r = next() >> (32 - k);
        while (r >= n) r = next() >> (32 - k);
        return lo + static_cast<int32_t>(r);
    }

  private:
    static constexpr int kN = 624;
    static constexpr int kM = 397;

    void init_genrand(uint32_t s) {
        mt_[0] = s;
        for (idx_ = 1; idx_ < kN; ++idx_) {
            mt_[idx_] = 1812433253u * (mt_[idx_ - 1] ^ (mt_[idx_ - 1] >> 30)) + idx_;
        }
    }

    void init_by_array(uint32_t key) {
        init_genrand(19650218u);
        int i = 1;
        for (int k = kN; k > 0; --k) {  // key length 1: j stays 0
            mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1664525u)) + key;
            if (++i >= kN) mt_[0] = mt_[kN - 1], i = 1;
        }
        for (int k = kN - 1; k > 0; --k) {
            mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1566083941u)) - i;
            if (++i >= kN) mt_[0] = mt_[kN - 1], i = 1;
        }
        mt_[0] = 0x80000000u;
        idx_ = kN;
    }

    uint32_t next() {
        if (idx_ >= kN) {
            for (int i = 0; i < kN; ++i) {
                const uint32_t y = (mt_[i] & 0x80000000u) | (mt_[(i + 1) % kN] & 0x7fffffffu);
                mt_[i] = mt_[(i + kM) % kN] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
            }
            idx_ = 0;
        }
        uint32_t y = mt_[idx_++];
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c5680u;
        y ^= (y << 15) & 0xefc60000u;
        return y ^ (y >> 18);
    }

    std::array<uint32_t, kN> mt_{};
    int idx_ = kN;
};

double now_s() {
    using Clock = std::chrono::steady_clock;
    return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

double rss_mb() {
    long pages = 0, resident = 0;
    if (FILE* f = std::fopen("/proc/self/statm", "r")) {
        if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
        std::fclose(f);
    }
    return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / 1048576.0;
}

double peak_rss_mb() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return static_cast<double>(ru.ru_maxrss) / 1024.0;  // kB on Linux
}

double load_avg_1min() {
    double avg[1] = {0.0};
    return getloadavg(avg, 1) == 1 ? avg[0] : -1.0;
}

double round_to(double v, int digits) {
    const double scale = std::pow(10.0, digits);
    return std::round(v * scale) / scale;
}

// A model and its context, loaded and created inside one timed region.
struct Engine {
    std::unique_ptr<Model> model;
    std::unique_ptr<InferenceContext> ctx;
    double load_s = 0.0;
};

Result<Engine> load_engine(const BenchOptions& opts, int32_t n_ctx) {
    Engine e;
    const double t0 = now_s();
    auto model =
        deltaserve::model::load_model(opts.model, {.show_progress = false, .repack = opts.repack});
    if (!model) return model.error();
    e.model = std::move(*model);
    auto ctx = InferenceContext::create(*e.model, {.n_ctx = n_ctx,
                                                   .n_threads = opts.threads,
                                                   .n_batch = opts.n_batch,
                                                   .backend = opts.backend});
    if (!ctx) return ctx.error();
    e.ctx = std::move(*ctx);
    e.load_s = now_s() - t0;
    return e;
}

// Draws ids and times eval() calls on one context, in the order the llama.cpp script does.
class Runner {
  public:
    explicit Runner(InferenceContext& ctx)
        : ctx_(ctx), n_vocab_(ctx.model().config.n_vocab), rng_(kSeed) {}

    // Evaluates n random ids after the current sequence in one eval(); returns seconds.
    Result<double> prefill(int32_t n) {
        const std::vector<int32_t> toks = random_tokens(n);
        const double t0 = now_s();
        auto logits = ctx_.eval(toks);
        const double dt = now_s() - t0;
        if (!logits) return logits.error().with_context("prefill of " + std::to_string(n));
        return dt;
    }

    // n single-token evals of random ids; returns the summed seconds.
    Result<double> decode_steps(int32_t n) {
        double total = 0.0;
        for (const int32_t t : random_tokens(n)) {
            const double t0 = now_s();
            auto logits = ctx_.eval(std::span<const int32_t>(&t, 1));
            total += now_s() - t0;
            if (!logits) return logits.error().with_context("decode");
        }
        return total;
    }

    void clear() { ctx_.reset(); }

  private:
    std::vector<int32_t> random_tokens(int32_t n) {
        std::vector<int32_t> toks(static_cast<size_t>(n));
        for (int32_t& t : toks) t = rng_.randrange(kFirstTokenId, n_vocab_);
        return toks;
    }

    InferenceContext& ctx_;
    int32_t n_vocab_;
    PyRandom rng_;
};

std::string fmt_rate(double tps) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f", tps);
    return buf;
}

struct Measurements {
    std::map<int32_t, double> prefill_s;  // best seconds per prefill length
    std::map<int32_t, double> decode_ms;  // best ms per token per decode depth
};

Result<Measurements> measure(const BenchOptions& opts, Runner& runner) {
    // Warm-up: page in the weights, start the thread pool, size the scratch buffers.
    if (auto r = runner.prefill(kWarmupTokens); !r) return r.error();
    if (auto r = runner.decode_steps(kWarmupDecodes); !r) return r.error();

    const std::set<int32_t> prefill(opts.prefill_lens.begin(), opts.prefill_lens.end());
    const std::set<int32_t> decode(opts.decode_ctx.begin(), opts.decode_ctx.end());
    std::set<int32_t> lengths = prefill;
    lengths.insert(decode.begin(), decode.end());

    Measurements m;
    for (const int32_t len : lengths) {
        for (int rep = 0; rep < opts.reps; ++rep) {
            runner.clear();
            DS_ASSIGN_OR_RETURN(const double t_pre, runner.prefill(len));
            if (prefill.contains(len)) {
                auto [it, fresh] = m.prefill_s.try_emplace(len, t_pre);
                if (!fresh) it->second = std::min(it->second, t_pre);
            }
            if (!decode.contains(len)) continue;
            DS_ASSIGN_OR_RETURN(const double t_dec, runner.decode_steps(opts.decode_tokens));
            const double ms = 1000.0 * t_dec / opts.decode_tokens;
            auto [it, fresh] = m.decode_ms.try_emplace(len, ms);
            if (!fresh) it->second = std::min(it->second, ms);
        }
        const auto pre = m.prefill_s.find(len);
        const auto dec = m.decode_ms.find(len);
        std::fprintf(stderr, "[deltaserve] context %d: prefill %s tok/s, decode %s tok/s\n", len,
                     pre == m.prefill_s.end() ? "-" : fmt_rate(len / pre->second).c_str(),
                     dec == m.decode_ms.end() ? "-" : fmt_rate(1000.0 / dec->second).c_str());
    }
    return m;
}

// B sequences of opts.batch_ctx random tokens decode opts.decode_tokens steps together, each
// step one eval_batch; returns tokens/s. The best of opts.reps.
Result<double> measure_batch(const BenchOptions& opts, const Model& model, int32_t batch) {
    auto pool = std::make_shared<deltaserve::ThreadPool>(opts.threads);
    const int32_t n_ctx = (opts.batch_ctx + opts.decode_tokens + 2 + 255) / 256 * 256;
    std::vector<std::unique_ptr<InferenceContext>> owned;
    std::vector<InferenceContext*> ctxs;
    PyRandom rng(kSeed);
    const int32_t n_vocab = model.config.n_vocab;
    for (int32_t b = 0; b < batch; ++b) {
        deltaserve::model::ContextOptions co{
            .n_ctx = n_ctx, .n_threads = opts.threads, .n_batch = opts.n_batch, .threads = pool};
        co.backend = opts.backend;
        co.kv.policy = opts.batch_kv_policy;
        co.kv.keep = opts.batch_kv_keep;
        co.kv_profile = opts.batch_kv_profile;
        auto ctx = InferenceContext::create(model, co);
        if (!ctx) return ctx.error();
        std::vector<int32_t> prompt(static_cast<size_t>(opts.batch_ctx));
        for (int32_t& t : prompt) t = rng.randrange(kFirstTokenId, n_vocab);
        if (auto r = (*ctx)->eval(prompt); !r) return r.error();
        ctxs.push_back(ctx->get());
        owned.push_back(std::move(*ctx));
    }
    std::vector<int32_t> next(static_cast<size_t>(batch));
    std::vector<std::span<const int32_t>> spans(static_cast<size_t>(batch));
    std::vector<float> logits;
    double best = 0.0;
    for (int rep = 0; rep < opts.reps; ++rep) {
        for (InferenceContext* c : ctxs) c->truncate(opts.batch_ctx);
        double seconds = 0.0;
        for (int32_t step = 0; step < opts.decode_tokens + 2; ++step) {
            for (int32_t b = 0; b < batch; ++b) {
                next[b] = rng.randrange(kFirstTokenId, n_vocab);
                spans[b] = std::span<const int32_t>(&next[b], 1);
            }
            const double t0 = now_s();
            DS_RETURN_IF_ERROR(deltaserve::model::eval_batch(ctxs, spans, logits));
            if (step >= 2) seconds += now_s() - t0;
        }
        best = std::max(best, batch * opts.decode_tokens / seconds);
    }
    std::fprintf(stderr, "[deltaserve] batch %d at context %d (%s): decode %s tok/s\n", batch,
                 opts.batch_ctx, opts.batch_kv_policy.c_str(), fmt_rate(best).c_str());
    return best;
}

Result<Json> run(const BenchOptions& opts) {
    int32_t need = kWarmupTokens + kWarmupDecodes;
    for (const int32_t l : opts.prefill_lens) need = std::max(need, l);
    for (const int32_t c : opts.decode_ctx) need = std::max(need, c + opts.decode_tokens);
    const int32_t n_ctx = (need + 255) / 256 * 256;
    const double load_avg_start = load_avg_1min();

    DS_ASSIGN_OR_RETURN(Engine engine, load_engine(opts, n_ctx));
    const double rss_after_load = rss_mb();
    double load_s = engine.load_s;
    Runner runner(*engine.ctx);
    DS_ASSIGN_OR_RETURN(const Measurements m, measure(opts, runner));
    Json batch_tps = Json::object();
    for (const int32_t b : opts.decode_batch) {
        DS_ASSIGN_OR_RETURN(const double tps, measure_batch(opts, *engine.model, b));
        batch_tps[std::to_string(b)] = round_to(tps, 2);
    }
    const double rss_after_runs = rss_mb();
    const auto& config = engine.model->config;
    Json out = {{"engine", "deltaserve"}, {"model", opts.model}, {"threads", opts.threads}};
    Json settings = {{"n_ctx", engine.ctx->n_ctx()},
                     {"n_batch", opts.n_batch},
                     {"repack", opts.repack},
                     {"n_threads", opts.threads},
                     {"device", std::string(opts.backend->name())},
                     {"kv_type", "f16"},
                     {"n_vocab", config.n_vocab},
                     {"decode_tokens", opts.decode_tokens},
                     {"reps", opts.reps},
                     {"tokens", "random ids in [256, n_vocab), Python random.Random(1234)"}};
    engine = Engine{};

    // More load samples (fresh model + context each time); the first one was the cold one.
    for (int i = 0; i < std::max(opts.reps, 2); ++i) {
        DS_ASSIGN_OR_RETURN(Engine e, load_engine(opts, n_ctx));
        load_s = std::min(load_s, e.load_s);
    }

    Json prefill_tps = Json::object(), decode_tps = Json::object();
    Json prefill_s = Json::object(), decode_ms = Json::object();
    for (const auto& [len, s] : m.prefill_s) {
        prefill_tps[std::to_string(len)] = round_to(len / s, 2);
        prefill_s[std::to_string(len)] = round_to(s, 4);
    }
    for (const auto& [len, ms] : m.decode_ms) {
        decode_tps[std::to_string(len)] = round_to(1000.0 / ms, 2);
        decode_ms[std::to_string(len)] = round_to(ms, 3);
    }
    out["load_s"] = round_to(load_s, 4);
    out["peak_rss_mb"] = round_to(peak_rss_mb(), 1);
    out["rss_after_load_mb"] = round_to(rss_after_load, 1);
    out["rss_after_runs_mb"] = round_to(rss_after_runs, 1);
    out["prefill_tps"] = prefill_tps;
    out["decode_tps"] = decode_tps;
    out["prefill_s"] = prefill_s;
    out["decode_ms_per_token"] = decode_ms;
    if (!opts.decode_batch.empty()) {
        out["decode_batch_tps"] = batch_tps;
        settings["batch_ctx"] = opts.batch_ctx;
        settings["batch_kv_policy"] = opts.batch_kv_policy;
        settings["batch_kv_keep"] = opts.batch_kv_keep;
    }
    out["settings"] = settings;
    out["loadavg_start_end"] = {load_avg_start, load_avg_1min()};
    return out;
}

void print_table(const Json& r) {
    std::printf("deltaserve runtime benchmark: %s, %d threads (load avg %.2f -> %.2f)\n\n",
                r["model"].get<std::string>().c_str(), r["threads"].get<int>(),
                r["loadavg_start_end"][0].get<double>(), r["loadavg_start_end"][1].get<double>());
    std::printf("%-28s %12.4f\n", "load (s)", r["load_s"].get<double>());
    std::printf("%-28s %12.1f\n", "peak RSS (MB)", r["peak_rss_mb"].get<double>());
    for (const auto& [len, tps] : r["prefill_tps"].items()) {
        std::printf("%-28s %12.1f\n", ("prefill " + len + " (tok/s)").c_str(), tps.get<double>());
    }
    for (const auto& [len, tps] : r["decode_tps"].items()) {
        std::printf("%-28s %12.1f\n", ("decode @" + len + " (tok/s)").c_str(), tps.get<double>());
    }
    if (r.contains("decode_batch_tps")) {
        const double one = r["decode_batch_tps"].value("1", 0.0);
        for (const auto& [b, tps] : r["decode_batch_tps"].items()) {
            std::printf("%-28s %12.1f", ("decode batch " + b + " (tok/s)").c_str(),
                        tps.get<double>());
            if (one > 0) std::printf("  (%.2fx batch 1)", tps.get<double>() / one);
            std::printf("\n");
        }
    }
}

Result<std::vector<int32_t>> parse_lens(const std::string& s) {
    std::vector<int32_t> out;
    size_t pos = 0;
    while (pos <= s.size()) {
        const size_t comma = std::min(s.find(',', pos), s.size());
        const std::string item = s.substr(pos, comma - pos);
        if (!item.empty()) {
            char* end = nullptr;
            const long v = std::strtol(item.c_str(), &end, 10);
            if (*end != '\0' || v <= 0 || v > (1L << 24)) {
                return deltaserve::invalid_argument("bad length '" + item + "' in '" + s + "'");
            }
            out.push_back(static_cast<int32_t>(v));
        }
        pos = comma + 1;
    }
    return out;
}

constexpr const char* kUsage =
    "usage: deltaserve-bench-runtime [--model M.gguf] [--threads 2] [--json]\n"
    "       [--prefill-lens 512,2048,8000] [--decode-ctx 128,2048,8000]\n"
    "       [--decode-tokens 64] [--n-batch 512] [--reps 1]\n"
    "       [--decode-batch 1,8,32] [--batch-ctx 200] [--no-repack] [--device cpu|cuda]\n"
    "       [--batch-kv-policy full] [--batch-kv-keep 1] [--batch-kv-profile deltakv.json]\n";

Result<int> parse_int(const std::string& flag, const std::string& v, int min) {
    char* end = nullptr;
    const long n = std::strtol(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || n < min || n > (1L << 24)) {
        return deltaserve::invalid_argument(flag + ": bad value '" + v + "'");
    }
    return static_cast<int>(n);
}

// Accepts --flag VALUE and --flag=VALUE. Errors: kInvalidArgument; kNotFound for --help.
Status parse_args(int argc, char** argv, BenchOptions& o) {
    for (int i = 1; i < argc; ++i) {
        std::string flag = argv[i], value;
        if (flag == "--help" || flag == "-h") return deltaserve::not_found("help");
        if (flag == "--json") {
            o.json = true;
            continue;
        }
        if (flag == "--no-repack") {
            o.repack = false;
            continue;
        }
        if (const size_t eq = flag.find('='); eq != std::string::npos) {
            value = flag.substr(eq + 1);
            flag.resize(eq);
        } else if (i + 1 < argc) {
            value = argv[++i];
        } else {
            return deltaserve::invalid_argument(flag + " needs a value");
        }
        if (flag == "--model") {
            o.model = value;
        } else if (flag == "--threads") {
            DS_ASSIGN_OR_RETURN(o.threads, parse_int(flag, value, 1));
        } else if (flag == "--prefill-lens") {
            DS_ASSIGN_OR_RETURN(o.prefill_lens, parse_lens(value));
        } else if (flag == "--decode-ctx") {
            DS_ASSIGN_OR_RETURN(o.decode_ctx, parse_lens(value));
        } else if (flag == "--decode-tokens") {
            DS_ASSIGN_OR_RETURN(o.decode_tokens, parse_int(flag, value, 1));
        } else if (flag == "--n-batch") {
            DS_ASSIGN_OR_RETURN(o.n_batch, parse_int(flag, value, 1));
        } else if (flag == "--decode-batch") {
            DS_ASSIGN_OR_RETURN(o.decode_batch, parse_lens(value));
        } else if (flag == "--batch-ctx") {
            DS_ASSIGN_OR_RETURN(o.batch_ctx, parse_int(flag, value, 1));
        } else if (flag == "--batch-kv-policy") {
            o.batch_kv_policy = value;
        } else if (flag == "--batch-kv-keep") {
            char* end = nullptr;
            o.batch_kv_keep = std::strtof(value.c_str(), &end);
            if (value.empty() || *end != '\0') {
                return deltaserve::invalid_argument(flag + ": bad value '" + value + "'");
            }
        } else if (flag == "--batch-kv-profile") {
            o.batch_kv_profile = value;
        } else if (flag == "--device") {
            o.device = value;
        } else if (flag == "--reps") {
            DS_ASSIGN_OR_RETURN(o.reps, parse_int(flag, value, 1));
        } else {
            return deltaserve::invalid_argument("unknown flag " + flag);
        }
    }
    return {};
}

}  // namespace

int main(int argc, char** argv) {
    BenchOptions opts;
    if (Status s = parse_args(argc, argv, opts); !s.ok()) {
        const bool help = s.code() == deltaserve::StatusCode::kNotFound;
        if (!help) std::fprintf(stderr, "deltaserve-bench-runtime: %s\n", s.message().c_str());
        std::fputs(kUsage, help ? stdout : stderr);
        return help ? 0 : 2;
    }
    Result<deltaserve::kernels::Backend*> backend =
        deltaserve::kernels::choose_backend(opts.device);
    if (!backend) {
        std::fprintf(stderr, "deltaserve-bench-runtime: %s\n", backend.error().message().c_str());
        return 2;
    }
    opts.backend = *backend;
    Result<Json> result = run(opts);
    if (!result) {
        std::fprintf(stderr, "deltaserve-bench-runtime: %s\n", result.error().to_string().c_str());
        return 1;
    }
    if (opts.json) {
        std::printf("%s\n", result->dump(1).c_str());
    } else {
        print_table(*result);
    }
    return 0;
}
