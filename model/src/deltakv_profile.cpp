#include "deltaserve/model/deltakv_profile.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>

#include <nlohmann/json.hpp>

#include "deltaserve/kernels/deltakv.h"
#include "safetensors.h"

namespace deltaserve::model {

std::string deltakv_model_id(const ModelConfig& c) {
    return c.name + "/" + std::to_string(c.n_layers) + "x" + std::to_string(c.kv_dim());
}

int32_t max_deltakv_latent(const ModelConfig& config) {
    return std::min(2 * config.kv_dim(), kernels::kMaxLatent);
}

Result<std::unique_ptr<kvstore::DeltaKvProfile>> load_deltakv_profile(const std::string& json_path,
                                                                      const ModelConfig& config) {
    namespace fs = std::filesystem;
    std::ifstream in(json_path);
    if (!in)
        return not_found("cannot open DeltaKV profile " + json_path +
                         " (make one with deltactl calibrate)");
    const auto j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.is_object() || j.value("format", "") != "deltaserve-deltakv/1") {
        return invalid_argument(json_path + " is not a deltaserve DeltaKV profile");
    }
    auto p = std::make_unique<kvstore::DeltaKvProfile>();
    try {
        p->model_id = j.at("model_id").get<std::string>();
        p->d = j.at("D").get<int32_t>();
        p->m = j.at("m").get<int32_t>();
        p->k = j.at("k").get<int32_t>();
        p->stride = j.at("stride").get<int32_t>();
        p->sinks = j.at("sinks").get<int32_t>();
        p->window = j.value("window", 64);
        p->latent_bits = j.value("latent_bits", 4);
        p->observation_layer = j.value("observation_layer", -1);
    } catch (const nlohmann::json::exception& e) {
        return invalid_argument(json_path + ": " + e.what());
    }
    if (p->model_id != deltakv_model_id(config)) {
        return invalid_argument(json_path + " was calibrated for '" + p->model_id +
                                "', not this model ('" + deltakv_model_id(config) + "')");
    }
    const int32_t max_m = max_deltakv_latent(config);
    if (p->d != 2 * config.kv_dim() || p->m < 1 || p->m > max_m || p->k < 1 || p->stride < 1 ||
        p->sinks < 0 || p->window < 1 || (p->latent_bits != 4 && p->latent_bits != 16)) {
        return invalid_argument(json_path + ": settings out of range (D must be " +
                                std::to_string(2 * config.kv_dim()) + ", m 1.." +
                                std::to_string(max_m) +
                                ", k, stride and window >= 1, latent_bits 4 or 16)");
    }
    const std::string weights =
        (fs::path(json_path).parent_path() / j.value("weights", "deltakv.safetensors")).string();
    DS_ASSIGN_OR_RETURN(SafetensorsFile st, SafetensorsFile::open(weights));
    const int64_t d = p->d, m = p->m;
    const auto tensor = [&](int32_t layer, const char* name, int64_t rows,
                            int64_t cols) -> Result<kernels::WeightMatrix> {
        const std::string key = "layers." + std::to_string(layer) + "." + name;
        const SafetensorsTensor* t = st.find(key);
        if (t == nullptr || t->dtype != "F32" || t->shape.size() != 2 ||
            (rows > 0 && t->shape[0] != rows) || (cols > 0 && t->shape[1] != cols)) {
            return invalid_argument(weights + ": tensor " + key + " is missing or misshapen");
        }
        p->storage.emplace_back(t->n_bytes / sizeof(float));
        std::memcpy(p->storage.back().data(), t->data, t->n_bytes);
        for (float x : p->storage.back()) {
            if (!std::isfinite(x))
                return invalid_argument(weights + ": tensor " + key + " holds NaN or infinity");
        }
        return kernels::WeightMatrix{kernels::DType::kF32, t->shape[0], t->shape[1],
                                     p->storage.back().data()};
    };
    p->storage.reserve(static_cast<size_t>(config.n_layers) * 4);
    for (int32_t l = 0; l < config.n_layers; ++l) {
        kernels::DeltaKvLayer w;
        // A sliding-window layer keeps its window exact: calibration trains none for it.
        if (config.is_window_layer(l) &&
            st.find("layers." + std::to_string(l) + ".enc.w1") == nullptr) {
            p->layers.push_back(w);
            continue;
        }
        DS_ASSIGN_OR_RETURN(w.w1, tensor(l, "enc.w1", -1, d));
        DS_ASSIGN_OR_RETURN(w.w2, tensor(l, "enc.w2", w.w1.rows, d));
        DS_ASSIGN_OR_RETURN(w.w3, tensor(l, "enc.w3", m, w.w1.rows));
        DS_ASSIGN_OR_RETURN(w.wd, tensor(l, "dec.w", d, m));
        p->layers.push_back(w);
    }
    // Most sensitive first: the measured order when calibrate wrote one, else by how badly
    // each layer's compressor reconstructs (relative error, highest first).
    if (j.contains("sensitivity_order")) {
        p->sensitivity_order = j["sensitivity_order"].get<std::vector<int32_t>>();
    } else {
        std::vector<double> err(static_cast<size_t>(config.n_layers), 0.0);
        for (const auto& l : j.value("layers", nlohmann::json::array())) {
            const int32_t i = l.value("layer", -1);
            if (i >= 0 && i < config.n_layers) err[i] = l.value("relative_error", 0.0);
        }
        p->sensitivity_order.resize(err.size());
        std::iota(p->sensitivity_order.begin(), p->sensitivity_order.end(), 0);
        std::stable_sort(p->sensitivity_order.begin(), p->sensitivity_order.end(),
                         [&](int32_t a, int32_t b) { return err[a] > err[b]; });
    }
    if (p->observation_layer < -1 || p->observation_layer >= config.n_layers) {
        return invalid_argument(json_path + ": observation_layer " +
                                std::to_string(p->observation_layer) + " is not a layer");
    }
    // Per layer, what calibration measured of the reconstructed keys' error (logit correction).
    if (j.contains("key_error_var")) {
        const auto& kv = j["key_error_var"];
        const size_t per = static_cast<size_t>(d / 4);  // KV heads x RoPE pairs
        if (!kv.is_array() || kv.size() != static_cast<size_t>(config.n_layers)) {
            return invalid_argument(json_path + ": key_error_var needs one list per layer");
        }
        for (const auto& l : kv) {
            std::vector<float> v;
            if (l.is_array()) {
                for (const auto& x : l) v.push_back(x.is_number() ? x.get<float>() : -1.0f);
            }
            if (!l.is_array() || (!v.empty() && v.size() != per) ||
                std::any_of(v.begin(), v.end(),
                            [](float x) { return !(x >= 0.0f && std::isfinite(x)); })) {
                return invalid_argument(json_path + ": key_error_var holds a layer that is not " +
                                        std::to_string(per) + " non-negative numbers");
            }
            p->key_error_var.push_back(std::move(v));
        }
    }
    kvstore::prepare_int4_decoders(*p);
    return p;
}

kvstore::DeltaKvOptions deltakv_options(const ModelConfig& c,
                                        const kvstore::DeltaKvProfile& profile) {
    kvstore::DeltaKvOptions o;
    o.n_layers = c.n_layers;
    o.n_kv_heads = c.n_kv_heads;
    o.head_dim = c.head_dim;
    o.rope_theta = c.rope_theta;
    o.rope_style = c.rope_style;
    o.sinks = profile.sinks;
    o.stride = profile.stride;
    o.k = profile.k;
    o.window = profile.window;
    o.latent_bits = profile.latent_bits;
    return o;
}

}  // namespace deltaserve::model
