#include "key_error.h"

#include <algorithm>
#include <cstdio>

#include "deltaserve/kvstore/deltakv_cache.h"
#include "deltaserve/model/deltakv_profile.h"
#include "deltaserve/model/inference_context.h"

namespace deltaserve::ops {

Result<nlohmann::json> measure_key_error(const model::Model& m, const std::string& profile_json,
                                         const std::vector<std::vector<int32_t>>& sequences,
                                         int threads) {
    const model::ModelConfig& c = m.config;
    DS_ASSIGN_OR_RETURN(auto profile, model::load_deltakv_profile(profile_json, c));
    const kvstore::DeltaKvOptions o = model::deltakv_options(c, *profile);
    const int32_t d = profile->d, per = d / 4;
    std::vector<std::vector<double>> sum(static_cast<size_t>(c.n_layers),
                                         std::vector<double>(per, 0.0));
    double weight = 0.0;
    ThreadPool pool(threads);
    for (const auto& tokens : sequences) {
        const int32_t n = static_cast<int32_t>(tokens.size());
        model::ContextOptions co;
        co.n_ctx = n;
        co.n_threads = threads;
        DS_ASSIGN_OR_RETURN(auto ctx, model::InferenceContext::create(m, co));
        std::vector<std::vector<float>> x(static_cast<size_t>(c.n_layers));
        ctx->set_kv_tap(
            [&](int32_t layer, const float* k, const float* v, int64_t rows, int64_t ld) {
                auto& xl = x[layer];
                for (int64_t t = 0; t < rows; ++t) {
                    xl.insert(xl.end(), k + t * ld, k + t * ld + d / 2);
                    xl.insert(xl.end(), v + t * ld, v + t * ld + d / 2);
                }
            });
        DS_RETURN_IF_ERROR(ctx->eval(tokens).status());
        const int32_t n_latent =
            n - std::min(n, o.sinks) - (n - std::min(n, o.sinks) + o.stride - 1) / o.stride;
        if (n_latent <= 0) continue;
        for (int32_t l = 0; l < c.n_layers; ++l) {
            if (!profile->has_compressor(l)) continue;
            const std::vector<float> var =
                kvstore::deltakv_key_error_variance(*profile, l, x[l].data(), n, o, pool);
            for (int32_t i = 0; i < per; ++i) sum[l][i] += static_cast<double>(var[i]) * n_latent;
        }
        weight += n_latent;
        std::fprintf(stderr, "[calibrate] key error measured on %d tokens\n", n);
    }
    if (weight == 0.0)
        return invalid_argument("no calibration sequence long enough to measure key errors");
    nlohmann::json out = nlohmann::json::array();
    for (int32_t l = 0; l < c.n_layers; ++l) {
        if (!profile->has_compressor(l)) {  // a window layer: nothing reconstructed
            out.push_back(nlohmann::json::array());
            continue;
        }
        std::vector<float> v(static_cast<size_t>(per));
        for (int32_t i = 0; i < per; ++i) v[i] = static_cast<float>(sum[l][i] / weight);
        out.push_back(v);
    }
    return out;
}

}  // namespace deltaserve::ops
