// deltactl calibrate: trains a model's DeltaKV compressors and writes its profile.
//
//  1. Runs the model over calibration text (Debian texts of several kinds by default; each
//     text an equal share) in sequences of --seq-len tokens, recording every layer's
//     pre-RoPE [K; V] rows (the forward pass's KV tap) to OUT/kv/.
//  2. Trains one compressor per layer on them with ops/calibrate/train_deltakv.py (NumPy):
//     per-layer reconstruction loss, as methods/deltakv.md section 4's first step.
//  3. Writes OUT/deltakv.json (m, k, stride, sinks, window, model id, per-layer errors) next to
//     OUT/deltakv.safetensors.
//
// Calibration runs the model itself, offline: a departure from "ops uses api clients only"
// noted in ops/README.md.
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include <nlohmann/json.hpp>

#include "calibration_text.h"
#include "commands.h"
#include "deltaserve/common/args.h"
#include "deltaserve/common/logging.h"
#include "deltaserve/model/deltakv_profile.h"
#include "deltaserve/model/inference_context.h"
#include "deltaserve/model/model.h"
#include "deltaserve/model/scoring.h"
#include "key_error.h"

namespace deltaserve::ops {

namespace fs = std::filesystem;

namespace {

// Debian's texts of several kinds: two licenses (GPL-3 is left out for evaluation), an X11
// protocol spec, the S-Lang and libjpeg manuals and three release-note files. deploy/setup.sh
// installs the packages they come with. None is a text the fidelity benchmark scores.
constexpr const char* kDefaultTexts =
    "/usr/share/common-licenses/GPL-2,/usr/share/common-licenses/LGPL-2.1,"
    "/usr/share/doc/xproto/x11protocol.txt.gz,/usr/share/doc/libslang2/slang.txt.gz,"
    "/usr/share/doc/libjpeg62-turbo-dev/libjpeg.txt.gz,/usr/share/doc/coreutils/NEWS.gz,"
    "/usr/share/doc/python3.11/NEWS.gz,/usr/share/doc/libc6/NEWS.gz";

// Sequences shorter than this hold too few references to learn from.
constexpr int32_t kMinSequence = 64;

std::vector<std::string> split(const std::string& s, char sep) {
    std::vector<std::string> out;
    std::stringstream in(s);
    for (std::string item; std::getline(in, item, sep);) {
        if (!item.empty()) out.push_back(item);
    }
    return out;
}

// Python with NumPy: $DELTASERVE_PYTHON, else Debian's (where setup installs python3-numpy).
std::string default_python() {
    if (const char* p = std::getenv("DELTASERVE_PYTHON")) return p;
    return fs::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
}

// Python with JAX for the end-to-end objective: $DELTASERVE_TOOLS_PYTHON, else the venv
// deploy/setup.sh makes.
std::string default_jax_python() {
    if (const char* p = std::getenv("DELTASERVE_TOOLS_PYTHON")) return p;
    return std::string(DELTASERVE_SOURCE_DIR) + "/.venv-tools/bin/python";
}

std::string shell_quote(const std::string& s) {
    std::string out = "'";
    for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
}

struct Options {
    std::string model_path, tokenizer_path, texts = kDefaultTexts, out, python = default_python();
    int32_t max_tokens = 16384, seq_len = 2048, epochs = 8, threads = 0;
    int32_t latent = 0, stride = 10;  // m (0: D/4, the paper's) and the reference stride
    int32_t trimkv_tokens = 4096, trimkv_seq = 512, trimkv_epochs = 6;
    std::string keep_kv;  // "yes" keeps OUT/kv
    std::string steps = "deltakv,trimkv";
    std::string objective = "mse";  // "ntp": then fine-tune end to end (train_deltakv_ntp.py)
    std::string jax_python = default_jax_python();
    int32_t ntp_steps = 40, ntp_seq_len = 1024;
};

// A calibration text's tokens.
Result<std::vector<int32_t>> text_tokens(const model::Model& m, const std::string& path) {
    DS_ASSIGN_OR_RETURN(std::string text, read_text(path));
    return m.tokenizer->encode(text, m.tokenizer->vocab().add_bos, false);
}

// One calibration sequence: a stretch of one text's tokens.
struct Sequence {
    std::string text;
    std::vector<int32_t> tokens;
};

// The calibration sequences, text by text: each text gives an equal share of max_tokens in
// sequences of at most seq_len tokens spread along it (spread_sequences), at least min_len
// tokens long, so no single text or genre fills the budget.
Result<std::vector<Sequence>> calibration_sequences(const Options& o, const model::Model& m,
                                                    int64_t max_tokens, int32_t seq_len,
                                                    int32_t min_len) {
    const std::vector<std::string> texts = split(o.texts, ',');
    if (texts.empty()) return invalid_argument("no calibration text given");
    const int64_t share =
        (max_tokens + static_cast<int64_t>(texts.size()) - 1) / static_cast<int64_t>(texts.size());
    std::vector<Sequence> out;
    for (const std::string& path : texts) {
        DS_ASSIGN_OR_RETURN(auto tokens, text_tokens(m, path));
        for (const TokenSpan& s :
             spread_sequences(static_cast<int64_t>(tokens.size()), share, seq_len, min_len)) {
            out.push_back({fs::path(path).filename().string(),
                           std::vector<int32_t>(tokens.begin() + s.begin,
                                                tokens.begin() + s.begin + s.size)});
        }
    }
    return out;
}

// Adds "key_error_var" (the logit correction's statistics, key_error.h) to OUT/deltakv.json,
// measured on the first 8192 calibration tokens.
Status add_key_error(const Options& o, const model::Model& m, const fs::path& out) {
    const fs::path json_path = out / "deltakv.json";
    std::ifstream in(json_path);
    auto profile = nlohmann::json::parse(in, nullptr, false);
    if (!in || profile.is_discarded())
        return not_found("no DeltaKV profile at " + json_path.string());
    in.close();
    DS_ASSIGN_OR_RETURN(auto sequences, calibration_sequences(o, m, std::min(o.max_tokens, 8192),
                                                              o.seq_len, kMinSequence));
    std::vector<std::vector<int32_t>> tokens;
    for (Sequence& s : sequences) tokens.push_back(std::move(s.tokens));
    DS_ASSIGN_OR_RETURN(profile["key_error_var"],
                        measure_key_error(m, json_path.string(), tokens, o.threads));
    std::ofstream(json_path) << profile.dump(1) << "\n";
    return Status();
}

// The layers DeltaKV may compress: all but a model's sliding-window layers, which keep their
// window exact (kvstore::DeltaKvOptions::window_layer) and get no compressor.
std::vector<int32_t> global_layers(const model::ModelConfig& c) {
    std::vector<int32_t> out;
    for (int32_t l = 0; l < c.n_layers; ++l) {
        if (!c.is_window_layer(l)) out.push_back(l);
    }
    return out;
}

// Records each global layer's rows [K (pre-RoPE); V] of every token to OUT/kv/layer_XX.f32.
// Also keeps the recorded sequences' tokens (for the end-to-end objective).
Status record_kv(const Options& o, const model::Model& m, const fs::path& kv_dir,
                 nlohmann::json& meta, std::vector<int32_t>& first_sequence,
                 std::vector<int32_t>& recorded) {
    model::ContextOptions co;
    co.n_ctx = o.seq_len;
    co.n_threads = o.threads;
    DS_ASSIGN_OR_RETURN(auto ctx, model::InferenceContext::create(m, co));
    const int32_t kv_dim = m.config.kv_dim();
    const std::vector<int32_t> layers = global_layers(m.config);
    std::vector<std::ofstream> files(static_cast<size_t>(m.config.n_layers));
    for (int32_t l : layers) {
        char name[32];
        std::snprintf(name, sizeof name, "layer_%02d.f32", l);
        files[l].open(kv_dir / name, std::ios::binary);
        if (!files[l]) return internal_error("cannot write " + (kv_dir / name).string());
    }
    std::vector<float> row(static_cast<size_t>(2 * kv_dim));
    ctx->set_kv_tap([&](int32_t layer, const float* k, const float* v, int64_t n, int64_t ld) {
        if (!files[layer].is_open()) return;  // a window layer
        for (int64_t t = 0; t < n; ++t) {
            std::copy_n(k + t * ld, kv_dim, row.data());
            std::copy_n(v + t * ld, kv_dim, row.data() + kv_dim);
            files[layer].write(reinterpret_cast<const char*>(row.data()),
                               static_cast<std::streamsize>(row.size() * sizeof(float)));
        }
    });
    DS_ASSIGN_OR_RETURN(auto sequences,
                        calibration_sequences(o, m, o.max_tokens, o.seq_len, kMinSequence));
    std::vector<int32_t> lengths;
    int64_t total = 0;
    for (const Sequence& s : sequences) {
        ctx->reset();
        DS_RETURN_IF_ERROR(ctx->eval(s.tokens).status());
        lengths.push_back(static_cast<int32_t>(s.tokens.size()));
        if (first_sequence.empty()) first_sequence = s.tokens;
        recorded.insert(recorded.end(), s.tokens.begin(), s.tokens.end());
        total += static_cast<int64_t>(s.tokens.size());
        std::fprintf(stderr, "[calibrate] recorded KV of %lld / %d tokens (%s)\n",
                     static_cast<long long>(total), o.max_tokens, s.text.c_str());
    }
    for (int32_t l : layers) {
        files[l].close();
        if (!files[l]) return internal_error("writing recorded KV failed (disk full?)");
    }
    if (lengths.empty()) return invalid_argument("no calibration text long enough (64+ tokens)");
    meta = {{"D", 2 * kv_dim},
            {"n_layers", m.config.n_layers},
            {"layers", layers},
            {"sequences", lengths}};
    std::ofstream(kv_dir / "meta.json") << meta.dump();
    return Status();
}

// TRIM-KV's training data: each layer's attention inputs (normed hidden states, Q and K after
// RoPE) over sequences of trimkv_seq tokens from the calibration texts, to
// DIR/layer_XX.{h,q,k}.f32.
Status record_attention(const Options& o, const model::Model& m, const fs::path& dir) {
    const model::ModelConfig& c = m.config;
    model::ContextOptions co;
    co.n_ctx = o.trimkv_seq;
    co.n_threads = o.threads;
    DS_ASSIGN_OR_RETURN(auto ctx, model::InferenceContext::create(m, co));
    std::vector<std::array<std::ofstream, 3>> files(static_cast<size_t>(c.n_layers));
    for (int32_t l = 0; l < c.n_layers; ++l) {
        char name[32];
        for (int f = 0; f < 3; ++f) {
            std::snprintf(name, sizeof name, "layer_%02d.%c.f32", l, "hqk"[f]);
            files[l][f].open(dir / name, std::ios::binary);
            if (!files[l][f]) return internal_error("cannot write " + (dir / name).string());
        }
    }
    const auto put = [](std::ofstream& f, const float* p, int64_t n) {
        f.write(reinterpret_cast<const char*>(p), static_cast<std::streamsize>(n * sizeof(float)));
    };
    ctx->set_attention_tap([&](int32_t layer, const float* h, int64_t ldh, const float* q,
                               int64_t ldq, const float* k, int64_t ldk, int64_t n) {
        for (int64_t t = 0; t < n; ++t) {
            put(files[layer][0], h + t * ldh, c.d_model);
            put(files[layer][1], q + t * ldq, c.q_dim());
            put(files[layer][2], k + t * ldk, c.kv_dim());
        }
    });
    // Whole sequences only: each text's share rounded down to whole sequences.
    const int64_t n_texts = static_cast<int64_t>(split(o.texts, ',').size());
    const int64_t per_text =
        std::max<int64_t>(1, o.trimkv_tokens / std::max<int64_t>(1, n_texts) / o.trimkv_seq);
    DS_ASSIGN_OR_RETURN(
        auto sequences,
        calibration_sequences(o, m, per_text * o.trimkv_seq * n_texts, o.trimkv_seq, o.trimkv_seq));
    std::vector<int32_t> lengths;
    int64_t total = 0;
    for (const Sequence& s : sequences) {
        ctx->reset();
        DS_RETURN_IF_ERROR(ctx->eval(s.tokens).status());
        lengths.push_back(o.trimkv_seq);
        total += o.trimkv_seq;
    }
    for (auto& layer : files) {
        for (auto& f : layer) {
            f.close();
            if (!f) return internal_error("writing recorded attention inputs failed (disk full?)");
        }
    }
    if (lengths.empty()) return invalid_argument("no calibration text holds a TRIM-KV sequence");
    std::ofstream(dir / "meta.json")
        << nlohmann::json{{"d_model", c.d_model},       {"n_heads", c.n_heads},
                          {"n_kv_heads", c.n_kv_heads}, {"head_dim", c.head_dim},
                          {"n_layers", c.n_layers},     {"sequences", lengths}}
               .dump();
    std::fprintf(stderr, "[calibrate] recorded attention inputs of %lld tokens for TRIM-KV\n",
                 static_cast<long long>(total));
    return Status();
}

// The keep target calibration measures DeltaKV at: the 30%.
constexpr float kMeasureKeep = 0.3f;

// The contexts calibration measures DeltaKV with (256 tokens per forward call, the deltakv
// policy at kMeasureKeep; the caller sets the profile and full layers), and full KV's
// logits of every token, which they are compared to.
Result<std::vector<float>> full_kv_logits(const Options& o, const model::Model& m,
                                          std::span<const int32_t> tokens,
                                          model::ContextOptions& co) {
    co.n_ctx = static_cast<int32_t>(tokens.size());
    co.n_threads = o.threads;
    co.n_batch = 256;
    DS_ASSIGN_OR_RETURN(auto full, model::InferenceContext::create(m, co));
    DS_ASSIGN_OR_RETURN(std::vector<float> ref, full->eval_all(tokens));
    co.kv.policy = "deltakv";
    co.kv.keep = kMeasureKeep;
    // The observation layer is measured by its pick alone, at the paper's 20% (the pins and
    // the followed tokens come from the sparse layers, whichever layer observes); chunks
    // attend as they did before pins; layers are measured compressing every token.
    co.deltakv_select = 0.2f;
    co.deltakv_pin = 0.0f;
    co.deltakv_follow = 0;
    co.deltakv_exact = 0.0f;
    return ref;
}

// Per-layer sensitivity: mean KL(full || DeltaKV with only that layer compressed) over a
// calibration sequence fed 256 tokens at a time (so compression happens along the way).
// Under a keep target no session with one layer compressed reaches, that layer compresses
// all it can (under a target of 1 it compresses only what makes room for the metadata).
Result<std::vector<double>> measure_sensitivity(const Options& o, const model::Model& m,
                                                const std::string& profile,
                                                const std::vector<int32_t>& tokens) {
    const int32_t n_layers = m.config.n_layers, n_vocab = m.config.n_vocab;
    model::ContextOptions co;
    DS_ASSIGN_OR_RETURN(std::vector<float> ref, full_kv_logits(o, m, tokens, co));
    co.kv_profile = profile;
    // A window layer is never compressed: its KL stays 0 (and it is never made full).
    std::vector<double> kl(static_cast<size_t>(n_layers), 0.0), lf, lp;
    const std::vector<int32_t> global = global_layers(m.config);
    for (int32_t layer : global) {
        co.deltakv_full_layers.assign(static_cast<size_t>(n_layers), 0);
        for (int32_t l : global) co.deltakv_full_layers[l] = l != layer;
        DS_ASSIGN_OR_RETURN(auto ctx, model::InferenceContext::create(m, co));
        DS_ASSIGN_OR_RETURN(std::vector<float> got, ctx->eval_all(tokens));
        for (size_t t = 0; t + 1 < tokens.size(); ++t) {
            model::log_softmax(ref.data() + t * n_vocab, n_vocab, lf);
            model::log_softmax(got.data() + t * n_vocab, n_vocab, lp);
            kl[layer] += model::kl_divergence(lf, lp) / static_cast<double>(tokens.size() - 1);
        }
        std::fprintf(stderr, "[calibrate] sensitivity of layer %d/%d: KL %.5f\n", layer,
                     n_layers - 1, kl[layer]);
    }
    return kl;
}

// The observation layer: which early layer, as the only full layer, best picks the tokens a
// decode step attends in the layers after it (OmniKV's filter layer; only the pick differs
// between candidates, every other layer compressed alike). Per candidate, the mean
// KL(full || DeltaKV) over the sequence's last tokens fed one at a time, the rest in chunks.
// Only the first few global layers are candidates: each costs a pass over the sequence, and
// the layers before the first full layer (the lead) attend the previous step's pick.
constexpr int32_t kObserverCandidates = 4;

struct Observers {
    std::vector<int32_t> layers;  // the candidates
    std::vector<double> kl;       // each one's
};

Result<Observers> measure_observers(const Options& o, const model::Model& m,
                                    const std::string& profile,
                                    const std::vector<int32_t>& tokens) {
    const int32_t n_layers = m.config.n_layers, n_vocab = m.config.n_vocab;
    const size_t tail = std::min<size_t>(128, tokens.size() / 4);
    const std::span<const int32_t> all(tokens), head = all.first(tokens.size() - tail);
    model::ContextOptions co;
    DS_ASSIGN_OR_RETURN(std::vector<float> ref, full_kv_logits(o, m, all, co));
    co.kv_profile = profile;
    Observers r;
    std::vector<double>& kl = r.kl;
    std::vector<double> lf, lp;
    r.layers = global_layers(m.config);
    r.layers.resize(std::min<size_t>(r.layers.size(), kObserverCandidates));
    for (int32_t layer : r.layers) {
        co.deltakv_full_layers.assign(static_cast<size_t>(n_layers), 0);
        co.deltakv_full_layers[layer] = 1;
        DS_ASSIGN_OR_RETURN(auto ctx, model::InferenceContext::create(m, co));
        DS_RETURN_IF_ERROR(ctx->eval(head).status());
        double sum = 0.0;
        for (size_t t = head.size(); t + 1 < tokens.size(); ++t) {
            DS_ASSIGN_OR_RETURN(std::span<const float> got, ctx->eval(all.subspan(t, 1)));
            model::log_softmax(ref.data() + t * n_vocab, n_vocab, lf);
            model::log_softmax(got.data(), n_vocab, lp);
            sum += model::kl_divergence(lf, lp);
        }
        kl.push_back(sum / static_cast<double>(tail - 1));
        std::fprintf(stderr, "[calibrate] layer %d as the observation layer: decode KL %.5f\n",
                     layer, kl.back());
    }
    return r;
}

// Runs `python ops/calibrate/<script> args...` on the recorded data (removed afterwards
// unless --keep-kv yes) and returns the report it wrote to OUT/<report>.
Result<nlohmann::json> run_script(const Options& o, const std::string& python,
                                  const std::string& script, const std::vector<std::string>& args,
                                  const fs::path& data, const fs::path& out,
                                  const std::string& report) {
    std::string cmd = shell_quote(python) + " " +
                      shell_quote(std::string(DELTASERVE_SOURCE_DIR) + "/ops/calibrate/" + script);
    for (const std::string& a : args) cmd += " " + shell_quote(a);
    const int rc = std::system(cmd.c_str());
    std::error_code ec;
    if (o.keep_kv != "yes") fs::remove_all(data, ec);
    if (rc != 0) {
        return internal_error("the trainer failed (exit " + std::to_string(WEXITSTATUS(rc)) +
                              "): " + cmd);
    }
    std::ifstream in(out / report);
    auto j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded())
        return internal_error("the trainer wrote no readable " + (out / report).string());
    return j;
}

Result<nlohmann::json> run_trainer(const Options& o, const std::string& script,
                                   const std::string& data_flag, const fs::path& data,
                                   const fs::path& out, int32_t epochs, const std::string& report) {
    return run_script(
        o, o.python, script,
        {data_flag, data.string(), "--out", out.string(), "--epochs", std::to_string(epochs)}, data,
        out, report);
}

// The end-to-end objective: writes the recorded tokens to OUT/ntp_tokens/ and fine-tunes
// OUT/deltakv.safetensors in place through the model (train_deltakv_ntp.py, JAX).
Result<nlohmann::json> fine_tune_ntp(const Options& o, const std::vector<int32_t>& tokens,
                                     const std::vector<int32_t>& lengths, const fs::path& out) {
    const fs::path dir = out / "ntp_tokens";
    std::error_code ec;
    fs::create_directories(dir, ec);
    std::ofstream f(dir / "tokens.i32", std::ios::binary);
    f.write(reinterpret_cast<const char*>(tokens.data()),
            static_cast<std::streamsize>(tokens.size() * sizeof(int32_t)));
    f.close();
    if (!f) return internal_error("cannot write " + (dir / "tokens.i32").string());
    std::ofstream(dir / "meta.json") << nlohmann::json{{"sequences", lengths}}.dump();
    return run_script(
        o, o.jax_python, "train_deltakv_ntp.py",
        {"--model", o.model_path, "--profile", out.string(), "--tokens", dir.string(), "--steps",
         std::to_string(o.ntp_steps), "--seq-len", std::to_string(o.ntp_seq_len)},
        dir, out, "train_ntp.json");
}

// Records KV, trains the compressors, measures sensitivity, writes OUT/deltakv.json.
int calibrate_deltakv(const Options& o, const model::Model& m, const fs::path& out) {
    const fs::path kv_dir = out / "kv";
    std::error_code ec;
    fs::create_directories(kv_dir, ec);
    nlohmann::json meta;
    std::vector<int32_t> first_sequence, recorded;
    if (Status st = record_kv(o, m, kv_dir, meta, first_sequence, recorded); !st.ok()) {
        std::fprintf(stderr, "deltactl: error: %s\n", st.message().c_str());
        return 1;
    }
    auto trained = run_script(
        o, o.python, "train_deltakv.py",
        {"--kv", kv_dir.string(), "--out", out.string(), "--epochs", std::to_string(o.epochs),
         "--m", std::to_string(o.latent), "--stride", std::to_string(o.stride)},
        kv_dir, out, "train.json");
    if (!trained.ok()) {
        std::fprintf(stderr, "deltactl: error: %s\n", trained.error().message().c_str());
        return 1;
    }
    const nlohmann::json& train = *trained;
    const model::ModelConfig& c = m.config;
    nlohmann::json profile = {
        {"format", "deltaserve-deltakv/1"},
        {"model_id", model::deltakv_model_id(c)},
        {"weights", "deltakv.safetensors"},
        {"D", train["D"]},
        {"m", train["m"]},
        {"hidden", train["hidden"]},
        {"k", train["k"]},
        {"stride", train["stride"]},
        {"sinks", train["sinks"]},
        {"window", 64},
        {"latent_bits", 4},
        {"calibration", {{"texts", split(o.texts, ',')}, {"tokens", meta["sequences"]}}},
        {"layers", train["layers"]}};
    std::ofstream(out / "deltakv.json") << profile.dump(1) << "\n";
    if (o.objective == "ntp") {
        auto ntp = fine_tune_ntp(o, recorded, meta["sequences"].get<std::vector<int32_t>>(), out);
        if (!ntp.ok()) {
            std::fprintf(stderr, "deltactl: error: %s\n", ntp.error().message().c_str());
            return 1;
        }
        profile["objective"] = "ntp";
        profile["layers"] = (*ntp)["layers"];
        profile["ntp"] = {{"steps", (*ntp)["steps"]},
                          {"seq_len", (*ntp)["seq_len"]},
                          {"held_out_ntp_full", (*ntp)["held_out_ntp_full"]},
                          {"held_out_ntp_before", (*ntp)["held_out_ntp_before"]},
                          {"held_out_ntp_after", (*ntp)["held_out_ntp_after"]}};
    } else {
        profile["objective"] = "mse";
    }
    std::ofstream(out / "deltakv.json") << profile.dump(1) << "\n";
    auto observers = measure_observers(o, m, (out / "deltakv.json").string(), first_sequence);
    if (!observers.ok()) {
        std::fprintf(stderr, "deltactl: error: measuring observation layers: %s\n",
                     observers.error().message().c_str());
        return 1;
    }
    profile["observer_kl"] = observers->kl;
    profile["observer_layers"] = observers->layers;
    profile["observation_layer"] =
        observers->layers[std::min_element(observers->kl.begin(), observers->kl.end()) -
                          observers->kl.begin()];
    // Which layers lose most when compressed: they are kept full after the observation layer.
    first_sequence.resize(std::min<size_t>(first_sequence.size(), 1024));
    auto kl = measure_sensitivity(o, m, (out / "deltakv.json").string(), first_sequence);
    if (!kl.ok()) {
        std::fprintf(stderr, "deltactl: error: measuring sensitivity: %s\n",
                     kl.error().message().c_str());
        return 1;
    }
    std::vector<int32_t> order = global_layers(c);  // (a window layer is never full)
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return (*kl)[a] > (*kl)[b]; });
    profile["sensitivity_kl"] = *kl;
    profile["sensitivity_order"] = order;
    std::ofstream(out / "deltakv.json") << profile.dump(1) << "\n";
    if (Status st = add_key_error(o, m, out); !st.ok()) {
        std::fprintf(stderr, "deltactl: error: measuring key errors: %s\n", st.message().c_str());
        return 1;
    }
    return 0;
}

// Records attention inputs, trains the gates, writes OUT/trimkv.json beside the weights.
int train_trimkv(const Options& o, const model::Model& m, const fs::path& out) {
    const fs::path dir = out / "trimkv_data";
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (Status st = record_attention(o, m, dir); !st.ok()) {
        std::fprintf(stderr, "deltactl: error: %s\n", st.message().c_str());
        return 1;
    }
    auto trained =
        run_trainer(o, "train_trimkv.py", "--data", dir, out, o.trimkv_epochs, "trimkv_train.json");
    if (!trained.ok()) {
        std::fprintf(stderr, "deltactl: error: %s\n", trained.error().message().c_str());
        return 1;
    }
    const nlohmann::json& train = *trained;
    const nlohmann::json j = {
        {"format", "deltaserve-trimkv/1"}, {"model_id", model::deltakv_model_id(m.config)},
        {"weights", "trimkv.safetensors"}, {"hidden", train["hidden"]},
        {"capacity", train["capacity"]},   {"layers", train["layers"]}};
    std::ofstream(out / "trimkv.json") << j.dump(1) << "\n";
    std::fprintf(stderr, "[calibrate] TRIM-KV gates written to %s\n",
                 (out / "trimkv.json").c_str());
    return 0;
}

}  // namespace

int calibrate_main(int argc, char** argv) {
    Options o;
    ArgParser p("deltactl calibrate",
                "Trains DeltaKV compressors for --model from text and writes a compression profile "
                "(deltakv.safetensors + deltakv.json) to --out.");
    p.add("model", &o.model_path, "GGUF file, Hugging Face directory or llama2.c checkpoint");
    p.add("tokenizer", &o.tokenizer_path, "tokenizer file overriding the model's");
    p.add("text", &o.texts, "calibration text files, comma-separated");
    p.add("tokens", &o.max_tokens, "calibration tokens at most");
    p.add("seq-len", &o.seq_len, "tokens per calibration sequence");
    p.add("epochs", &o.epochs, "training epochs per layer");
    p.add("latent", &o.latent, "DeltaKV latent size m; 0 = D/4");
    p.add("stride", &o.stride,
          "DeltaKV reference stride: every stride-th compressed token kept full");
    p.add("threads", &o.threads, "threads for the model; 0 = one per core");
    p.add("out", &o.out, "profile folder (default: profiles/<model file name>)");
    p.add("python", &o.python, "Python 3 with NumPy for the trainer");
    p.add("keep-kv", &o.keep_kv, "yes: keep the recorded KV in <out>/kv");
    p.add("steps", &o.steps,
          "what to train: deltakv, trimkv or both; keyerr: only (re)measure an existing "
          "DeltaKV profile's key errors (the logit correction)");
    p.add("objective", &o.objective,
          "DeltaKV objective: mse (per-layer reconstruction) or ntp (then fine-tuned end to end "
          "through the model's "
          "next-token loss; needs a GGUF model and JAX)");
    p.add("ntp-steps", &o.ntp_steps, "end-to-end objective: training steps (one sequence each)");
    p.add("ntp-seq-len", &o.ntp_seq_len, "end-to-end objective: tokens per training sequence");
    p.add("jax-python", &o.jax_python, "Python with jax[cpu] and gguf for --objective ntp");
    p.add("trimkv-tokens", &o.trimkv_tokens,
          "TRIM-KV gates: training tokens (0: do not train gates)");
    p.add("trimkv-seq", &o.trimkv_seq, "TRIM-KV gates: tokens per training sequence");
    p.add("trimkv-epochs", &o.trimkv_epochs, "TRIM-KV gates: epochs per layer");
    if (auto code = parse_flags(p, argc, argv)) return *code;
    init_logging("warn");
    if (o.model_path.empty()) {
        std::fprintf(stderr, "deltactl: error: --model is required\n");
        return 2;
    }
    if (o.seq_len < 64 || o.max_tokens < 64 || o.epochs < 1 || o.trimkv_seq < 16 ||
        o.trimkv_epochs < 1 || o.trimkv_tokens < 0 || o.latent < 0 || o.stride < 1) {
        std::fprintf(stderr,
                     "deltactl: error: --seq-len and --tokens must be >= 64, --trimkv-seq >= 16, "
                     "--epochs, --trimkv-epochs and --stride >= 1, --latent >= 0\n");
        return 2;
    }
    if (o.objective != "mse" && o.objective != "ntp") {
        std::fprintf(stderr, "deltactl: error: --objective must be mse or ntp, not '%s'\n",
                     o.objective.c_str());
        return 2;
    }
    if (o.objective == "ntp") {
        if (o.ntp_steps < 1 || o.ntp_seq_len < 64) {
            std::fprintf(stderr,
                         "deltactl: error: --ntp-steps must be >= 1 and --ntp-seq-len >= 64\n");
            return 2;
        }
        if (fs::path(o.model_path).extension() != ".gguf") {
            std::fprintf(
                stderr,
                "deltactl: error: --objective ntp needs a GGUF model (its JAX twin reads GGUF), "
                "not %s\n",
                o.model_path.c_str());
            return 2;
        }
        if (!fs::exists(o.jax_python)) {
            std::fprintf(stderr,
                         "deltactl: error: --objective ntp needs Python with JAX: %s is missing "
                         "(deploy/setup.sh installs it; or pass --jax-python)\n",
                         o.jax_python.c_str());
            return 2;
        }
    }
    if (o.out.empty()) o.out = "profiles/" + fs::path(o.model_path).filename().string();
    model::LoadOptions lo;
    lo.tokenizer_path = o.tokenizer_path;
    lo.show_progress = false;
    auto m = model::load_model(o.model_path, lo);
    if (!m.ok()) {
        std::fprintf(stderr, "deltactl: error: %s\n", m.error().message().c_str());
        return 1;
    }
    if (o.objective == "ntp" && (*m)->config.arch != "llama") {
        std::fprintf(stderr,
                     "deltactl: error: --objective ntp implements the llama architecture only "
                     "(its JAX twin), not %s\n",
                     (*m)->config.arch.c_str());
        return 2;
    }
    if (o.latent > model::max_deltakv_latent((*m)->config)) {
        std::fprintf(stderr, "deltactl: error: --latent must be at most %d for this model\n",
                     model::max_deltakv_latent((*m)->config));
        return 2;
    }
    const fs::path out(o.out);
    std::error_code ec;
    fs::create_directories(out, ec);
    if (ec) {
        std::fprintf(stderr, "deltactl: error: cannot create %s: %s\n", out.c_str(),
                     ec.message().c_str());
        return 1;
    }
    const auto steps = split(o.steps, ',');
    const bool do_deltakv = std::find(steps.begin(), steps.end(), "deltakv") != steps.end();
    const bool do_trimkv =
        std::find(steps.begin(), steps.end(), "trimkv") != steps.end() && o.trimkv_tokens > 0;
    if (do_deltakv && calibrate_deltakv(o, **m, out) != 0) return 1;
    if (!do_deltakv && std::find(steps.begin(), steps.end(), "keyerr") != steps.end()) {
        if (Status st = add_key_error(o, **m, out); !st.ok()) {
            std::fprintf(stderr, "deltactl: error: %s\n", st.message().c_str());
            return 1;
        }
    }
    if (do_trimkv && train_trimkv(o, **m, out) != 0) return 1;
    std::fprintf(stderr, "[calibrate] profile written to %s\n", out.c_str());
    return 0;
}

}  // namespace deltaserve::ops
