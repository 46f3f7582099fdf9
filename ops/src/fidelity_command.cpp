// deltactl fidelity ID: what compression costs a stored session, recomputed offline with the
// model. Its blocks are taken into a context of the same policy (the stored cache, as a node
// would resume it) and its history into a full KV one; both step back over the session's last
// tokens and feed them again one at a time: the next-token KL of the stored cache against
// full KV there, and whether their top tokens agree. Per layer: the error of the stored rows
// as attention gets them (latents reconstructed) against full KV's rows of the same history,
// the reconstruction error recorded when its tokens were compressed, and how far the stored
// cache moves the hidden state the layer hands on (over the same tokens).
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "command_support.h"
#include "commands.h"
#include "deltaserve/common/logging.h"
#include "deltaserve/model/inference_context.h"
#include "deltaserve/model/kv_blocks.h"
#include "deltaserve/model/model.h"
#include "deltaserve/model/sampler.h"
#include "deltaserve/model/scoring.h"
#include "session_view.h"
#include "table.h"

namespace deltaserve::ops {

int fidelity_main(int argc, char** argv) {
    const std::string id = take_id(argc, argv);
    Common c;
    std::string model_path, profile;
    float keep = 0.3f;
    int32_t tail = 32, threads = 0;
    ArgParser p("deltactl fidelity ID",
                "Recomputes a stored session's history with full KV (offline, with the model) "
                "and reports the next-token KL of its stored cache against full KV over its last "
                "tokens; per layer, how far it moves the hidden state there, and the "
                "reconstruction error recorded at compression.");
    add_common(p, c);
    p.add("model", &model_path, "the model the server ran (GGUF, Hugging Face folder)");
    p.add("kv-profile", &profile, "the DeltaKV profile the server ran (deltakv.json)");
    p.add("kv-keep", &keep, "the server's --kv-keep (its layer roles follow from it)");
    p.add("tail", &tail, "the session's last tokens fed again and compared");
    p.add("threads", &threads, "threads for the model; 0 = one per core");
    if (auto code = parse_flags(p, argc, argv)) return *code;
    if (int code = offline_only(c, "deltactl fidelity")) return code;
    init_logging("warn");
    if (id.empty()) return usage_error("deltactl fidelity: which session? (ID or TENANT/ID)");
    if (model_path.empty()) return usage_error("deltactl fidelity: --model is required");
    if (tail < 1) return usage_error("--tail must be at least 1");
    int code = 0;
    auto view = open_view(c, &code);
    if (!view) return code;
    auto s = view->session(id);
    if (!s.ok()) return store_error(s.status());
    if (!s->has_kv_record) return store_error(not_found("session " + id + " has no stored KV"));
    const Described d = describe_blocks(*s, store_reader(*view, *s->store));
    std::vector<std::vector<uint8_t>> blocks;
    for (const BlockRow& b : d.blocks) {
        if (b.check != "ok")
            return store_error(data_loss("session " + id + ": block " + short_hash(b.key) + " is " +
                                         b.check + " (deltactl explain)"));
        auto bytes = view->read_block(*s->store, b.key);
        if (!bytes.ok()) return store_error(bytes.status());
        blocks.push_back(std::move(*bytes));
    }
    auto first = parse_any_block_header(blocks.front());
    if (!first.ok()) return store_error(first.status());

    model::LoadOptions lo;
    lo.show_progress = false;
    auto m = model::load_model(model_path, lo);
    if (!m.ok()) return store_error(m.status());
    const std::vector<int32_t>& tokens = s->record.tokens;
    const int32_t n = static_cast<int32_t>(tokens.size());
    const int32_t k = std::min(tail, n - 1);
    if (k < 1) return store_error(failed_precondition("session " + id + " holds one token"));
    model::ContextOptions co;
    co.n_ctx = n + 16;
    co.n_threads = threads;
    const bool deltakv = first->codec == kvstore::KvCodecId::kDeltaKv;
    auto full = model::InferenceContext::create(**m, co);
    if (!full.ok()) return store_error(full.status());
    co.kv.policy = deltakv ? "deltakv" : "full";
    co.kv.keep = deltakv ? keep : 1.0f;
    co.kv_profile = profile;
    auto stored = model::InferenceContext::create(**m, co);
    if (!stored.ok()) return store_error(stored.status());
    model::KvBlocksOptions ko;
    ko.fingerprint = s->fingerprint;
    ko.root = first->parent;
    ko.codec = first->codec;
    const std::vector<std::span<const uint8_t>> views(blocks.begin(), blocks.end());
    if (Status st = model::import_kv_blocks(**stored, views, s->record.hints, ko); !st.ok()) {
        return store_error(Status(st.code(),
                                  "the stored cache does not fit this model and these "
                                  "settings (give the server's --model, --kv-profile "
                                  "and --kv-keep): " +
                                      st.message()));
    }
    // The exact KV of the history (pre-RoPE K and V as full KV's forward pass makes them) at
    // up to kSampled positions spread over it, against the stored cache's rows there.
    const model::ModelConfig& cfg = (*m)->config;
    const size_t row = static_cast<size_t>(2 * cfg.kv_dim());
    constexpr int32_t kSampled = 1024;
    const int32_t step = std::max(1, (n + kSampled - 1) / kSampled);
    std::vector<int32_t> sampled;
    for (int32_t p0 = 0; p0 < n; p0 += step) sampled.push_back(p0);
    std::vector<std::vector<float>> exact(static_cast<size_t>(cfg.n_layers),
                                          std::vector<float>(sampled.size() * row));
    std::vector<int32_t> seen(static_cast<size_t>(cfg.n_layers), 0);
    (*full)->set_kv_tap([&](int32_t layer, const float* kk, const float* v, int64_t rows,
                            int64_t ld) {
        const size_t kv = row / 2;
        for (int64_t i = 0; i < rows; ++i) {
            const int32_t pos = seen[static_cast<size_t>(layer)]++;
            if (pos % step != 0 || pos / step >= static_cast<int32_t>(sampled.size())) continue;
            float* x =
                exact[static_cast<size_t>(layer)].data() + static_cast<size_t>(pos / step) * row;
            std::copy(kk + i * ld, kk + i * ld + kv, x);
            std::copy(v + i * ld, v + i * ld + kv, x + kv);
        }
    });
    if (auto r = (*full)->eval(tokens); !r.ok()) return store_error(r.status());
    (*full)->set_kv_tap(nullptr);
    // Per layer: the root mean of |x_stored - x_exact|^2 / |x_exact|^2, over the latents and
    // over the exact rows (NaN where none, or where the cache keeps no rows of its own).
    std::vector<double> err_latent(static_cast<size_t>(cfg.n_layers), NAN),
        err_exact(err_latent.size(), NAN);
    if (deltakv) {
        std::vector<float> rows;
        std::vector<uint8_t> latent;
        for (int32_t l = 0; l < cfg.n_layers; ++l) {
            if (Status st = (*stored)->kv_attended_rows(l, sampled, &rows, &latent); !st.ok())
                return store_error(st);
            double sum[2] = {0.0, 0.0};
            int64_t count[2] = {0, 0};
            for (size_t j = 0; j < sampled.size(); ++j) {
                if (latent[j] > 1) continue;  // a window layer's row past its window
                const float* a = rows.data() + j * row;
                const float* b = exact[static_cast<size_t>(l)].data() + j * row;
                double e = 0.0, x = 0.0;
                for (size_t t = 0; t < row; ++t) {
                    e += (static_cast<double>(a[t]) - b[t]) * (static_cast<double>(a[t]) - b[t]);
                    x += static_cast<double>(b[t]) * b[t];
                }
                if (x <= 0.0) continue;
                sum[latent[j]] += e / x;
                ++count[latent[j]];
            }
            if (count[1] > 0) err_latent[static_cast<size_t>(l)] = std::sqrt(sum[1] / count[1]);
            if (count[0] > 0) err_exact[static_cast<size_t>(l)] = std::sqrt(sum[0] / count[0]);
        }
    }
    (*stored)->truncate(n - k);
    (*full)->truncate(n - k);
    // Each layer's input (the normed hidden state the layers before it made) on both sides:
    // the stored cache's drift after each layer, over the tokens compared.
    const size_t dm = static_cast<size_t>(cfg.d_model);
    std::vector<float> in_full(static_cast<size_t>(cfg.n_layers) * dm), in_stored(in_full.size());
    const auto tap = [dm](std::vector<float>& into) {
        return [&into, dm](int32_t layer, const float* h, int64_t ldh, const float*, int64_t,
                           const float*, int64_t, int64_t n) {
            const float* last = h + (n - 1) * ldh;
            std::copy(last, last + dm, into.begin() + static_cast<ptrdiff_t>(layer * dm));
        };
    };
    (*full)->set_attention_tap(tap(in_full));
    (*stored)->set_attention_tap(tap(in_stored));
    std::vector<double> drift_sq(static_cast<size_t>(cfg.n_layers)), norm_sq(drift_sq.size());
    std::vector<double> kl, lf, ls;
    int32_t agree = 0;
    for (int32_t i = n - k; i < n; ++i) {
        auto a = (*full)->eval({&tokens[i], 1});
        if (!a.ok()) return store_error(a.status());
        const std::vector<float> fa(a->begin(), a->end());
        auto b = (*stored)->eval({&tokens[i], 1});
        if (!b.ok()) return store_error(b.status());
        for (size_t j = 0; j < in_full.size(); ++j) {
            const double e = static_cast<double>(in_stored[j]) - in_full[j];
            drift_sq[j / dm] += e * e;
            norm_sq[j / dm] += static_cast<double>(in_full[j]) * in_full[j];
        }
        model::log_softmax(fa.data(), static_cast<int32_t>(fa.size()), lf);
        model::log_softmax(b->data(), static_cast<int32_t>(b->size()), ls);
        kl.push_back(model::kl_divergence(lf, ls));
        agree += model::greedy(fa) == model::greedy(*b);
    }
    // After layer l: the input of layer l + 1 (the last layer's output is the logits: the KL).
    const auto drift = [&](size_t l) {
        return l + 1 < drift_sq.size() && norm_sq[l + 1] > 0.0
                   ? std::sqrt(drift_sq[l + 1] / norm_sq[l + 1])
                   : NAN;
    };
    double mean = 0.0, worst = 0.0;
    for (double x : kl) {
        mean += x / static_cast<double>(kl.size());
        worst = std::max(worst, x);
    }
    if (c.as_json) {
        json layers = json::array();
        for (size_t l = 0; l < d.layers.size(); ++l) {
            layers.push_back({{"layer", l},
                              {"role", layer_role(d, l)},
                              {"drift", or_null(drift(l))},
                              {"latent_error", or_null(err_latent[l])},
                              {"exact_rows_error", or_null(err_exact[l])},
                              {"recorded_error", or_null(d.layers[l].error())}});
        }
        std::printf("%s\n", json_text(c, json({{"session", s->name()},
                                               {"policy", d.policy},
                                               {"tokens", n},
                                               {"compared", k},
                                               {"kl_mean", mean},
                                               {"kl_max", worst},
                                               {"top1_agree", agree},
                                               {"positions_compared", sampled.size()},
                                               {"kl", kl},
                                               {"layers", std::move(layers)}}))
                                .c_str());
        return 0;
    }
    std::printf(
        "Session %s (%s, %d tokens): over its last %d tokens, fed again one at a time\n"
        "after its stored cache and after full KV of the same history:\n"
        "  next-token KL(full KV || stored): mean %.4f, max %.4f\n"
        "  top tokens agree: %d of %d\n\n",
        s->name().c_str(), d.policy.c_str(), n, k, mean, worst, agree, k);
    Table t(
        {"LAYER", "ROLE", "LATENTS VS EXACT", "EXACT ROWS VS EXACT", "RECORDED ERROR", "DRIFT"});
    for (size_t l = 0; l < d.layers.size(); ++l)
        t.add({std::to_string(l), layer_role(d, l), fixed3(err_latent[l]), fixed3(err_exact[l]),
               fixed3(d.layers[l].error()), fixed3(drift(l))});
    t.print();
    std::printf(
        "\nVS EXACT: the root mean |x - x_full|^2 / |x_full|^2 of the layer's [K; V] rows as the "
        "stored cache gives them to attention (latents reconstructed; exact rows as stored)\n"
        "against full KV's of the same history, at %zu positions; RECORDED ERROR: that of the "
        "latents against the KV they were made from, measured as they were compressed;\nDRIFT: "
        "|h - h_full| / |h_full| of the hidden state after the layer (the next one's normed "
        "input), over the last tokens.\n",
        sampled.size());
    return 0;
}

}  // namespace deltaserve::ops
